package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// errAbandoned ends a launch worker whose record its gang group gave up
// (burstctl.GroupNextOffer, burstctl.ErrAbandoned at create): nothing is
// left for it to do.
var errAbandoned = errors.New("launch abandoned")

// placementName is the placement group of a gang's machines (EC2 cluster
// placement group, GCE compact placement policy): one per group, named
// after it; empty for a machine launched alone.
func placementName(r *broker.InstanceRecord) string {
	if r.Group == "" {
		return ""
	}
	return "spillway-" + strings.ReplaceAll(safeTag(r.Group), "_", "-")
}

// StepError marks a failure that ends the machine's launch, with the
// step that failed.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// LaunchWorker carries one record from requested to ready, persisting each
// step before the next external call. It may be restarted at any step.
func (f *Fleet) LaunchWorker(ctx context.Context, id string) {
	log := f.log.With("record", id)
	for ctx.Err() == nil {
		rec, prov := f.Record(id)
		if rec == nil {
			return
		}
		if prov == nil {
			f.failLaunch(ctx, id, &StepError{"launch", fmt.Errorf("provider %q is not configured", rec.Provider)})
			return
		}
		var err error
		switch rec.State {
		case broker.MachineRequested:
			err = f.stepCreate(ctx, rec, prov)
		case broker.MachineProvisioning:
			err = f.stepRunning(ctx, rec, prov)
		case broker.MachineBootstrapping:
			err = f.stepBootstrap(ctx, rec, prov)
		default:
			return
		}
		if errors.Is(err, errAbandoned) {
			return // the group moved on without this record
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("burst launch failed", "state", rec.State, "err", err)
			f.failLaunch(ctx, id, err)
			return
		}
	}
}

// stepCreate asks the provider for the machine (idempotent on the record
// id), moving to the next offer on a capacity, quota or unsupported error.
func (f *Fleet) stepCreate(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if _, err := f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.Attempts++
		return nil, nil
	}); err != nil {
		return err
	}
	tags := map[string]string{"team": safeTag(rec.Team)}
	if len(rec.Jobs) > 0 {
		tags["job"] = safeTag(strings.ToLower(rec.Jobs[0]))
	}
	var backoff time.Duration = time.Second
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		inst, err := prov.Create(cctx, providers.CreateRequest{RecordID: rec.ID, Offer: rec.Offer, Tags: tags,
			SSHAuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(f.signer.PublicKey()))),
			Placement:        placementName(rec)})
		cancel()
		switch {
		case err == nil:
			err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				return c.Launched(ctx, rec.ID, now, *inst)
			})
			if errors.Is(err, burstctl.ErrAbandoned) {
				// Its gang group was given up while this member was being
				// created: delete it now (the reconciler would, later).
				f.log.Info("burst machine created for a group given up; deleting it", "record", rec.ID, "instance", inst.ID)
				dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				if err := prov.Delete(dctx, inst.ID); err != nil && !providers.IsNotFound(err) {
					f.log.Warn("delete abandoned burst machine; the reconciler will", "record", rec.ID, "err", err)
				}
				cancel()
				_, _ = f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
					r.Deletes++
					return nil, nil
				})
				f.dropPlacement(ctx, rec, prov)
				return errAbandoned
			}
			return err
		case providers.IsNextOffer(err) && rec.Group != "":
			// A gang's machines are one offer: the whole group moves on.
			f.noteCapacityError(rec.Offer, err)
			cause := err
			ok := false
			if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				var err error
				ok, err = c.GroupNextOffer(ctx, rec.ID, now, cause)
				return err
			}); err != nil {
				return &StepError{"create", err}
			}
			f.log.Info("burst offer unavailable for a gang member; the group moves on", "record", rec.ID, "group", rec.Group, "err", cause, "next", ok)
			// The group given up may have made its placement group and no
			// machine: nothing else would delete it.
			f.dropPlacement(ctx, rec, prov)
			return errAbandoned
		case providers.IsNextOffer(err):
			f.noteCapacityError(rec.Offer, err)
			var next providers.Offer
			ok := false
			cause := err
			if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				var err error
				next, ok, err = c.NextOffer(ctx, rec.ID, now, cause)
				return err
			}); err != nil {
				return &StepError{"create", err}
			}
			if !ok {
				return &StepError{"create", fmt.Errorf("no offer could be had: %w", err)}
			}
			f.log.Info("burst offer unavailable, trying the next", "record", rec.ID, "err", err, "next", next.Key())
			rec, prov = f.Record(rec.ID)
			if prov == nil {
				return &StepError{"create", fmt.Errorf("provider %q is not configured", rec.Provider)}
			}
			backoff = time.Second
		case providers.IsUnauthorized(err) || errors.Is(err, providers.ErrInvalidRequest) || attempt >= 5:
			return &StepError{"create", err}
		default:
			f.log.Warn("burst create failed; retrying", "record", rec.ID, "err", err, "in", backoff)
			if !f.wait(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(2*backoff, time.Minute)
		}
	}
}

func safeTag(s string) string {
	s = strings.ToLower(s)
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// stepRunning waits until the provider reports the machine running with an
// address.
func (f *Fleet) stepRunning(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	inst, err := providers.WaitRunning(cctx, prov, rec.ProviderID, 2*time.Second)
	if err != nil {
		return &StepError{"wait for running", err}
	}
	return f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		return c.Running(ctx, rec.ID, now, *inst)
	})
}

// stepBootstrap gives the machine its own agent token and brings the
// agent up; the machine is ready when the agent registered.
func (f *Fleet) stepBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if rec.SlurmNode != "" {
		return f.st.SlurmBootstrap(ctx, rec, prov)
	}
	token := newToken()
	sum := sha256.Sum256([]byte(token))
	sha := hex.EncodeToString(sum[:])
	old := rec.TokenSHA256
	started := f.clock.Now()
	if _, err := f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.TokenSHA256 = sha
		return nil, func(tx broker.Tx) error {
			if err := broker.DeleteInstanceToken(tx, old); err != nil {
				return err
			}
			return broker.PutInstanceToken(tx, sha, r.ID)
		}
	}); err != nil {
		return err
	}
	gpus := f.cfg().Burst.AgentGPUs
	if gpus == "sim" {
		gpus = fmt.Sprintf("sim:%dx%s-%dGB", max(rec.Offer.GPUs, 1), firstNonEmpty(rec.Offer.GPUModel, "H100"), max(rec.Offer.GPUMemoryBytes>>30, 1))
	}
	agent := bootstrap.AgentConfig{Broker: f.cfg().AdvertiseURL, Token: token, Name: rec.ID, GPUs: gpus, CA: f.st.BrokerCA(),
		DataDir: machineDir(f.cfg().Burst.AgentDataDir, rec.ID), Data: f.adapt().AgentData,
		Labels: map[string]string{"pool": rec.Provider, "instance": rec.ID, "provider": rec.Provider,
			"region": rec.Offer.Region, "instanceType": rec.Offer.InstanceType},
		Runtime: f.st.AgentRuntime(rec.Provider), Notice: f.noticeWatch(rec)}
	registered := func(ctx context.Context) error { return f.waitRegistered(ctx, rec.ID, started) }
	tr, err := f.bootstrap(ctx, rec, prov, agent, registered)
	var raw json.RawMessage
	if tr != nil {
		raw, _ = json.Marshal(tr)
	}
	if err != nil {
		_, _ = f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Bootstrap = raw
			return nil, nil
		})
		if providers.IsHostKeyMismatch(err) {
			return &StepError{"bootstrap", fmt.Errorf("host key mismatch, nothing was run: %w", err)}
		}
		return &StepError{"bootstrap", err}
	}
	if _, err := f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.Bootstrap = raw
		return nil, nil
	}); err != nil {
		return err
	}
	return f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		f.metrics.BurstLead.WithLabelValues(rec.Provider).Observe(now.Sub(rec.CreatedAt).Seconds())
		return c.Ready(ctx, rec.ID, now)
	})
}

// sshBootstrap is the real bootstrap over SSH.
func (f *Fleet) sshBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider, agent bootstrap.AgentConfig, registered func(context.Context) error) (*bootstrap.Transcript, error) {
	target := bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: f.signer,
		HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
	opts := bootstrap.Options{Agent: agent, RemoteDir: machineDir(f.cfg().Burst.RemoteDir, rec.ID),
		Binaries: f.cfg().Burst.Binaries, WaitRegistered: registered, Logger: f.log.With("record", rec.ID),
		NoSudo: f.cfg().Burst.AgentSudo == "never"}
	if f.cfg().Burst.AgentInit == "supervised" {
		opts.Init = bootstrap.InitSupervised
	}
	return bootstrap.Run(ctx, target, opts)
}

// machineDir expands "{machine}" in a configured remote path to the
// record id, so machines sharing one filesystem (the broker's own host
// under `spillway dev --burst`) keep their agents apart.
func machineDir(dir, id string) string { return strings.ReplaceAll(dir, "{machine}", id) }

// waitRegistered returns once the machine's agent has registered since
// the bootstrap began.
func (f *Fleet) waitRegistered(ctx context.Context, id string, since time.Time) error {
	for {
		f.st.Lock()
		n, ok := f.st.Node(id)
		done := ok && n.State == broker.NodeReady && !n.RegisteredAt.Before(since.Add(-time.Second))
		f.st.Unlock()
		if done {
			return nil
		}
		unpark := f.st.Park()
		select {
		case <-ctx.Done():
			unpark()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		unpark()
	}
}

// failLaunch ends a launch that cannot go on (burstctl's Fail): the
// waiting jobs go back to the queue with the reason, the reservation is
// released, the token revoked, and a machine that exists is deleted.
func (f *Fleet) failLaunch(ctx context.Context, id string, cause error) {
	var rec *broker.InstanceRecord
	if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		var err error
		rec, err = c.Fail(ctx, id, now, cause)
		return err
	}); err != nil {
		f.log.Error("burst launch failed and could not be recorded", "record", id, "cause", cause, "err", err)
		return
	}
	if rec.SlurmNode != "" {
		f.st.SlurmDown(ctx, rec.SlurmNode, "spillway: "+cause.Error())
	}
	if rec.State == broker.MachineTerminating {
		f.TerminateWorker(ctx, id) // deletes the placement group after the machine
		return
	}
	if _, prov := f.Record(id); prov != nil {
		f.dropPlacement(ctx, rec, prov)
	}
}

// TerminateWorker deletes the machine, retrying until the provider says it
// is gone, then closes the record.
func (f *Fleet) TerminateWorker(ctx context.Context, id string) {
	rec, prov := f.Record(id)
	if rec == nil {
		return
	}
	if _, err := f.Update(ctx, id, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		sha := r.TokenSHA256
		return nil, func(tx broker.Tx) error { return broker.DeleteInstanceToken(tx, sha) }
	}); err != nil {
		f.log.Error("revoke machine token", "record", id, "err", err)
	}
	backoff := time.Second
	for ctx.Err() == nil && rec.ProviderID != "" && prov != nil {
		if rec.Offer.Prepaid && rec.SSHHost != "" && f.signer != nil {
			// A leased host stays up: stop the agent before giving it back.
			target := bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: f.signer,
				HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			if _, err := bootstrap.Stop(cctx, target, bootstrap.StopOptions{RemoteDir: machineDir(f.cfg().Burst.RemoteDir, rec.ID)}); err != nil {
				f.log.Warn("stop agent on leased host", "record", id, "err", err)
			}
			cancel()
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := prov.Delete(cctx, rec.ProviderID)
		cancel()
		_, _ = f.Update(ctx, id, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Deletes++
			return nil, nil
		})
		if providers.IsNotFound(err) {
			break
		}
		if err != nil {
			f.log.Warn("burst delete failed; retrying", "record", id, "err", err, "in", backoff)
		} else if gone(ctx, prov, rec.ProviderID) {
			// Deleted at once: the machine stops costing now, not a
			// backoff later.
			break
		}
		if !f.wait(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	if ctx.Err() != nil {
		return
	}
	f.CloseRecord(ctx, id, "deleted", "the provider reports the machine gone", time.Time{})
	f.dropPlacement(ctx, rec, prov)
}

// dropPlacement deletes a gang group's placement group once every one of
// its records has ended: after the last machine is deleted, and when the
// group is given up or fails with no machine made. The provider refuses
// while a deleted machine is still shutting down (EC2: InUse), so it
// retries for a few minutes.
func (f *Fleet) dropPlacement(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) {
	pl, ok := prov.(providers.Placer)
	if rec.Group == "" || !ok {
		return
	}
	f.st.Lock()
	for _, r := range f.instances {
		if r.Group == rec.Group && !r.State.Ended() {
			f.st.Unlock()
			return
		}
	}
	f.st.Unlock()
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := pl.DeletePlacement(cctx, placementName(rec))
		cancel()
		if err == nil {
			return
		}
		if attempt == 8 || ctx.Err() != nil {
			f.log.Warn("delete placement group; giving up", "group", rec.Group, "err", err)
			return
		}
		f.log.Info("delete placement group; retrying", "group", rec.Group, "err", err, "in", backoff)
		if !f.wait(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// wait sleeps d on the fleet's clock, parked (the broker's term counts
// this goroutine as waiting outside it); false when ctx ended first.
func (f *Fleet) wait(ctx context.Context, d time.Duration) bool {
	unpark := f.st.Park()
	defer unpark()
	select {
	case <-ctx.Done():
		return false
	case <-f.clock.After(d):
		return true
	}
}

// gone reports whether the provider no longer knows machine id.
func gone(ctx context.Context, prov providers.Provider, id string) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := prov.Get(cctx, id)
	return providers.IsNotFound(err)
}

// CloseRecord ends a record whose machine is gone (burstctl's Close),
// metered up to end (now when zero).
func (f *Fleet) CloseRecord(ctx context.Context, id, reason, detail string, end time.Time) {
	if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		return c.Close(ctx, id, now, end, reason, detail)
	}); err != nil {
		f.log.Error("close burst record", "record", id, "err", err)
		return
	}
	f.log.Info("burst machine ended", "record", id, "reason", reason)
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
