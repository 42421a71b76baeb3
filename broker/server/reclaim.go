package server

import (
	"context"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/providers"
)

// Spot reclaims (docs/bursting.md, "Spot interruptions"). The agent on a
// spot or preemptible machine watches its provider's notice (onprem/agent,
// notice.go) and reports it in its heartbeat. The broker then, in one
// transaction:
//
//   - records the notice on the machine and moves it to draining (reason
//     spot_reclaim), so nothing new is bound to it or started on it;
//   - returns the jobs still waiting for it to the queue, keeping their
//     wait (head of their class: they burst again without a new minimum
//     wait);
//   - asks the jobs running on it to stop with their checkpoint signal,
//     the grace cut to fit before the reclaim;
//   - keeps the offer out of decisions for burst.offerCoolDown, so the
//     next decision replaces the machine with another offer (on-demand
//     when no other spot offer fits).
//
// Each stopped job returns to the queue when its agent reports the end,
// with the work lost since its last committed checkpoint in the history.
// The machine, once empty, is scaled down; the ledger closes it at the
// reclaim time at the latest.

// reclaimState is guarded by Server.mu.
type reclaimState struct {
	// coolDowns by offer key.
	coolDowns map[string]burst.CoolDown
}

// noticeWatch is what a burst machine's agent watches: the metadata server
// of its provider, for spot and preemptible machines only.
func (s *Server) noticeWatch(rec *broker.InstanceRecord) *agentapi.NoticeWatch {
	if !rec.Offer.Spot {
		return nil
	}
	for _, pc := range s.adapt().Providers {
		switch {
		case pc.AWS != nil && pc.Name() == rec.Provider:
			return &agentapi.NoticeWatch{Provider: "aws", Endpoint: pc.AWS.MetadataEndpoint}
		case pc.GCP != nil && pc.Name() == rec.Provider:
			return &agentapi.NoticeWatch{Provider: "gcp", Endpoint: pc.GCP.MetadataEndpoint}
		}
	}
	return nil
}

// coolDownLocked keeps an offer out of decisions for the configured time.
func (s *Server) coolDownLocked(o providers.Offer, now time.Time, reason string) {
	if s.reclaim.coolDowns == nil {
		s.reclaim.coolDowns = map[string]burst.CoolDown{}
	}
	s.reclaim.coolDowns[o.Key()] = burst.CoolDown{Until: now.Add(s.cfg().Burst.OfferCoolDown.D()), Reason: reason}
	s.log.Info("offer cooling down", "offer", o.Key(), "for", s.cfg().Burst.OfferCoolDown.D(), "reason", reason)
}

// noteCapacityError cools an offer down after the provider refused it.
func (s *Server) noteCapacityError(o providers.Offer, err error) {
	s.lock()
	defer s.mu.Unlock()
	s.coolDownLocked(o, s.clock.Now(), "the provider refused it: "+err.Error())
}

// coolDownsLocked are the cool-downs still running at now (a copy: the
// decision's input).
func (s *Server) coolDownsLocked(now time.Time) map[string]burst.CoolDown {
	out := map[string]burst.CoolDown{}
	for k, c := range s.reclaim.coolDowns {
		if now.Before(c.Until) {
			out[k] = c
		} else {
			delete(s.reclaim.coolDowns, k)
		}
	}
	return out
}

// noteNoticesLocked acts on the notices a burst machine's agent reports.
// It is idempotent: the agent repeats its notices in every heartbeat.
func (s *Server) noteNoticesLocked(ctx context.Context, node string, notices []agentapi.Notice, now time.Time) error {
	r, ok := s.burst.instances[node]
	if !ok || len(notices) == 0 {
		return nil
	}
	for _, n := range notices {
		if n.Ending() {
			if r.Reclaim != nil {
				continue
			}
			return s.reclaimLocked(ctx, r, n, now)
		}
		if !hasTransition(r, n.Kind) {
			rr := r.Clone()
			rr.History = append(rr.History, broker.Transition{At: now, From: broker.State(r.State), To: broker.State(r.State),
				Reason: n.Kind, Detail: "the provider says this spot machine is at elevated risk of interruption; its jobs took a checkpoint"})
			if err := s.putRecordLocked(ctx, rr, nil, nil); err != nil {
				return err
			}
			r = rr
		}
	}
	return nil
}

func hasTransition(r *broker.InstanceRecord, reason string) bool {
	for _, t := range r.History {
		if t.Reason == reason {
			return true
		}
	}
	return false
}

// reclaimLocked marks a machine ending on the provider's notice, requeues
// what waits for it and stops what runs on it (burstctl.Reclaim, the rules
// the simulator runs too), and cools its offer down.
func (s *Server) reclaimLocked(ctx context.Context, r *broker.InstanceRecord, n agentapi.Notice, now time.Time) error {
	cd, jobs, ok, err := s.burstCtl().Reclaim(ctx, r.ID, now, broker.Reclaim{Kind: n.Kind, Action: n.Action, At: n.ReclaimAt, SeenAt: n.SeenAt})
	if err != nil || !ok {
		return err
	}
	s.coolDownLocked(r.Offer, now, cd.Reason)
	s.log.Warn("burst machine reclaimed by its provider", "record", r.ID, "provider", r.Provider, "at", s.burst.instances[r.ID].Reclaim.At, "jobs", jobs)
	s.wakeNodeLocked(r.ID)
	s.kick()
	return nil
}
