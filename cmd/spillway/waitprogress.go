package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// waitProgress prints what a waiting job goes through, one line per
// change: the pending reason when its kind changes (not every tick of a
// countdown), then the burst machine's steps as they happen: requested,
// created, booted, host key verified, uploads, agent started, registered.
type waitProgress struct {
	w         io.Writer
	lastCode  string
	lastMsg   string
	machine   string
	seen      int  // machine history entries printed
	bootstrap bool // transcript printed
}

// job prints what changed since the last call.
func (p *waitProgress) job(ctx context.Context, c *client.Client, j *broker.Job) {
	if j.Pending != nil {
		code, msg := string(j.State)+"/"+j.Pending.Code, j.Pending.Message
		if code != p.lastCode || (j.Pending.Code == "" && msg != p.lastMsg) {
			fmt.Fprintf(p.w, "spillway: %s: %s\n", j.State, msg)
			p.lastCode, p.lastMsg = code, msg
		}
	}
	if j.Machine == "" {
		return
	}
	if j.Machine != p.machine {
		p.machine, p.seen, p.bootstrap = j.Machine, 0, false
	}
	inst, err := c.Instance(ctx, j.Machine)
	if err != nil {
		return
	}
	p.instance(inst.InstanceRecord)
}

// instance prints the machine's new history entries, and its bootstrap
// steps just before "registered".
func (p *waitProgress) instance(r *broker.InstanceRecord) {
	if r == nil {
		return
	}
	for ; p.seen < len(r.History); p.seen++ {
		t := r.History[p.seen]
		if t.Reason == "registered" && !p.bootstrap {
			p.transcript(r.Bootstrap)
		}
		fmt.Fprintf(p.w, "spillway: burst %s: %s: %s\n", r.ID, t.To, burstStepLine(t))
	}
	if !p.bootstrap && len(r.Bootstrap) > 0 && r.State == "failed" {
		p.transcript(r.Bootstrap)
	}
}

func burstStepLine(t broker.Transition) string {
	switch t.Reason {
	case "created":
		return "created " + t.Detail
	case "running":
		return "booted, " + t.Detail
	}
	return t.Detail
}

func (p *waitProgress) transcript(raw json.RawMessage) {
	p.bootstrap = true
	var tr bootstrap.Transcript
	if len(raw) == 0 || json.Unmarshal(raw, &tr) != nil {
		return
	}
	if tr.HostKey != "" {
		fmt.Fprintf(p.w, "spillway: burst %s: host key %s verified against the provider\n", p.machine, tr.HostKey)
	}
	for _, s := range tr.Steps {
		if s.Name == "connect" || s.Name == "register" {
			continue
		}
		status := "ok"
		switch {
		case s.Skipped:
			status = "skipped"
		case s.ExitCode != 0:
			status = fmt.Sprintf("exit %d", s.ExitCode)
		}
		fmt.Fprintf(p.w, "spillway: burst %s: %s: %s (%s)\n", p.machine, s.Name, status, s.Duration.Round(time.Millisecond))
	}
}

// done prints the burst machine's remaining steps once the job has left
// the queue: the agent may register and take the job between two polls,
// and the job may even start before the broker has recorded the
// machine's registration (the record is written by its launch worker
// just after the agent's first report). So it waits, up to doneWait,
// until the record shows the registration or an end.
func (p *waitProgress) done(ctx context.Context, c *client.Client) {
	if p.machine == "" {
		return
	}
	deadline := time.Now().Add(doneWait)
	for {
		inst, err := c.Instance(ctx, p.machine)
		if err != nil {
			return
		}
		p.instance(inst.InstanceRecord)
		if p.bootstrap || inst.State.Ended() || inst.State == broker.MachineReady || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// doneWait bounds how long done waits for the machine's record.
const doneWait = 10 * time.Second
