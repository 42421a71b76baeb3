package broker

import (
	"strings"
	"testing"
)

func dataLimits() SpecLimits {
	lim := testLimits()
	lim.Buckets = map[string][]string{"nlp": {"s3://nlp-data/", "gs://nlp-ckpt", "https://huggingface.co"}}
	return lim
}

func TestDataFieldsAreValidatedByField(t *testing.T) {
	base := "team: nlp\nresources: {gpus: 1}\ncommand: [python, train.py]\n"
	for name, tc := range map[string]struct{ yaml, field string }{
		"input outside the team's buckets":  {"inputs: [{from: s3://other/x, to: data}]", "inputs[0].from"},
		"input with a bad scheme":           {"inputs: [{from: ftp://nlp-data/x, to: data}]", "inputs[0].from"},
		"input without a destination":       {"inputs: [{from: s3://nlp-data/x}]", "inputs[0].to"},
		"input escaping the workdir":        {"inputs: [{from: s3://nlp-data/x, to: ../../etc}]", "inputs[0].to"},
		"output to https":                   {"outputs: [{from: out, to: https://huggingface.co/x}]", "outputs[0].to"},
		"output with an unknown when":       {"outputs: [{from: out, to: s3://nlp-data/o/, when: sometimes}]", "outputs[0].when"},
		"checkpoint.to without a dir":       {"checkpoint: {to: gs://nlp-ckpt/run1/}", "checkpoint.dir"},
		"checkpoint.to outside the buckets": {"checkpoint: {dir: ckpt, to: s3://elsewhere/c/}", "checkpoint.to"},
		"keep without to":                   {"checkpoint: {dir: ckpt, keep: 2}", "checkpoint.keep"},
		"keep out of range":                 {"checkpoint: {dir: ckpt, to: gs://nlp-ckpt/c/, keep: 1000}", "checkpoint.keep"},
		"interval too short":                {"checkpoint: {dir: ckpt, to: gs://nlp-ckpt/c/, interval: 5s}", "checkpoint.interval"},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := ParseSpec([]byte(base + tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			s.Normalize("nlp", dataLimits())
			err = s.Validate(dataLimits())
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("want an error on %s, got %v", tc.field, err)
			}
		})
	}
	t.Run("a team without buckets", func(t *testing.T) {
		s, _ := ParseSpec([]byte("team: cv\n" + base[len("team: nlp\n"):] + "inputs: [{from: s3://nlp-data/x, to: d}]"))
		s.Normalize("cv", dataLimits())
		if err := s.Validate(dataLimits()); err == nil || !strings.Contains(err.Error(), "teams[].buckets") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a good spec", func(t *testing.T) {
		s, err := ParseSpec([]byte(base + `inputs: [{from: s3://nlp-data/sets/v1/, to: data}, {from: "https://huggingface.co/m/x.bin", to: /models/x.bin, cache: false}]
outputs: [{from: out, to: s3://nlp-data/runs/1/}]
checkpoint: {signal: SIGUSR1, grace: 2m, dir: ckpt, to: gs://nlp-ckpt/run1/, interval: 10m}`))
		if err != nil {
			t.Fatal(err)
		}
		s.Normalize("nlp", dataLimits())
		if err := s.Validate(dataLimits()); err != nil {
			t.Fatal(err)
		}
		if s.Checkpoint.Keep != 3 || s.Outputs[0].When != "always" || !s.HasData() {
			t.Fatalf("defaults: %+v %+v", s.Checkpoint, s.Outputs)
		}
	})
}
