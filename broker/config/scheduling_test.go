package config

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
)

func TestSchedulingFieldsNamed(t *testing.T) {
	cases := map[string]string{
		"dataDir: x\nscheduler: {fairShareHalfLife: 1s}":                           "scheduler.fairShareHalfLife",
		"dataDir: x\nscheduler: {starvationAge: 400d}":                             "scheduler.starvationAge",
		"dataDir: x\nscheduler: {weights: {size: -1}}":                             "scheduler.weights.size",
		"dataDir: x\nscheduler: {maxSharersPerGPU: 65}":                            "scheduler.maxSharersPerGPU",
		"dataDir: x\nscheduler: {preemptionLimit: -1}":                             "scheduler.preemptionLimit",
		"dataDir: x\nscheduler: {gangLabel: 'bad label'}":                          "scheduler.gangLabel",
		"dataDir: x\nqueues: [{name: default, reserved: -2}]":                      "queues[0].reserved",
		"dataDir: x\nteams: [{name: nlp}, {name: nlp}]":                            "teams[1].name",
		"dataDir: x\nteams: [{name: nlp, share: -1}]":                              "teams[0].share",
		"dataDir: x\nteams: [{name: nlp, quota: {gpus: -1}}]":                      "teams[0].quota.gpus",
		"dataDir: x\nteams: [{name: nlp, quota: {gpus: 1, borrowLimit: -1}}]":      "teams[0].quota.borrowLimit",
		"dataDir: x\nteams: [{name: nlp, projects: [{name: a}, {name: a}]}]":       "teams[0].projects[1].name",
		"dataDir: x\nteams: [{name: nlp, projects: [{name: a, borrowLimit: -3}]}]": "teams[0].projects[0].borrowLimit",
		"dataDir: x\nteams: [{name: nlp, quota: {gpus: 1, borow: 2}}]":             "teams[0].quota.borow",
	}
	for doc, field := range cases {
		_, err := Parse([]byte(doc))
		ve, ok := broker.AsValidation(err)
		if !ok || ve.First().Field != field {
			t.Errorf("%q: got %v, want an error on %s", doc, err, field)
		}
	}
}

// TestPolicyFromConfig: the defaults match sched.DefaultPolicy, and teams,
// quotas and queue reservations reach the scheduler.
func TestPolicyFromConfig(t *testing.T) {
	c, err := Parse([]byte("dataDir: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sched.DefaultPolicy(), c.Policy()); diff != "" {
		t.Errorf("default policy differs from sched.DefaultPolicy (-sched +config):\n%s", diff)
	}
	c, err = Parse([]byte(`dataDir: x
scheduler: {starvationAge: 2h, weights: {age: 0}, preemptionLimit: 3}
queues:
  - {name: default}
  - {name: inference, kind: latency, reserved: 4, sharing: true}
teams:
  - name: nlp
    share: 2
    quota: {gpus: 16, borrowLimit: 8}
    projects: [{name: chat, gpus: 8, borrowLimit: 0}]
  - {name: vision, quota: {gpus: 8}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Policy()
	want := sched.DefaultPolicy()
	want.StarvationAge = 2 * time.Hour
	want.Weights.Age = 0
	want.PreemptionLimit = 3
	want.Queues = map[string]sched.QueuePolicy{"default": {Kind: sched.Batch}, "inference": {Kind: sched.Latency, Reserved: 4, Sharing: true}}
	eight, zero := 8, 0
	want.Teams = map[string]sched.TeamPolicy{
		"nlp":    {Share: 2, Quota: &sched.Quota{GPUs: 16, BorrowLimit: &eight}, Projects: map[string]sched.Quota{"chat": {GPUs: 8, BorrowLimit: &zero}}},
		"vision": {Share: 1, Quota: &sched.Quota{GPUs: 8}},
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
}
