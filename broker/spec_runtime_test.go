package broker

import (
	"errors"
	"strings"
	"testing"
)

func runtimeLimits() SpecLimits {
	lim := testLimits()
	lim.Mounts = []MountRule{
		{Source: "/data/datasets", ReadOnly: true},
		{Source: "/scratch"},
		{Source: "models"},
		{Source: "/vision-only", Teams: []string{"vision"}},
	}
	return lim
}

func TestRuntimeFieldsValidate(t *testing.T) {
	cases := []struct {
		name  string
		doc   string
		field string // "" when valid
		rule  string
	}{
		{"image and mounts in the allow-list", `{image: "registry.example.com:5000/nlp/train:1.2", command: [sh], resources: {gpus: 1}, mounts: [{source: /data/datasets/imagenet, target: /data, readOnly: true}, {source: models, target: /models}, {source: /scratch}], shmSize: 8Gi, user: alice}`, "", ""},
		{"the seed's gpu alias", `{command: [sh], resources: {gpu: 2, memory: 16Gi}}`, "", ""},
		{"gpu and gpus disagree", `{command: [sh], resources: {gpu: 2, gpus: 1}}`, "resources.gpu", "another name"},
		{"mount outside the allow-list", `{command: [sh], resources: {gpus: 1}, mounts: [{source: /etc, target: /x}]}`, "mounts[0].source", "allow-list"},
		{"a sibling that shares a prefix", `{command: [sh], resources: {gpus: 1}, mounts: [{source: /scratch2}]}`, "mounts[0].source", "allow-list"},
		{"dot-dot escape", `{command: [sh], resources: {gpus: 1}, mounts: [{source: "/scratch/../etc"}]}`, "mounts[0].source", "clean"},
		{"another team's mount", `{command: [sh], resources: {gpus: 1}, mounts: [{source: /vision-only}]}`, "mounts[0].source", "allow-list"},
		{"read-only source mounted read-write", `{command: [sh], resources: {gpus: 1}, mounts: [{source: /data/datasets, target: /d}]}`, "mounts[0].readOnly", "read-only"},
		{"volume without target", `{command: [sh], resources: {gpus: 1}, mounts: [{source: models}]}`, "mounts[0].target", "required"},
		{"target over /proc", `{command: [sh], resources: {gpus: 1}, mounts: [{source: /scratch, target: /proc}]}`, "mounts[0].target", "cannot hide"},
		{"bad image", `{image: "UPPER/Case::x", command: [sh], resources: {gpus: 1}}`, "image", "OCI image reference"},
		{"root user", `{command: [sh], resources: {gpus: 1}, user: root}`, "user", "never run as root"},
		{"uid 0", `{command: [sh], resources: {gpus: 1}, user: "0"}`, "user", "never run as root"},
		{"shm without image", `{command: [sh], resources: {gpus: 1}, shmSize: 1Gi}`, "shmSize", "needs an image"},
		{"bad upload hash", `{command: [sh], resources: {gpus: 1}, workdirUpload: "md5:abc"}`, "workdirUpload", "sha256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := ParseSpec([]byte("# yaml\n" + c.doc))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			s.Normalize("nlp", runtimeLimits())
			err = s.Validate(runtimeLimits())
			if c.field == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("want a validation error on %s, got %v", c.field, err)
			}
			for _, fe := range ve.Errors {
				if fe.Field == c.field && strings.Contains(fe.Message, c.rule) {
					return
				}
			}
			t.Fatalf("want %s: …%s…, got %v", c.field, c.rule, err)
		})
	}
}

func TestGPUAliasBecomesGPUs(t *testing.T) {
	s, err := ParseSpec([]byte("resources: {gpu: 1, memory: 16Gi}\ncommand: [python, train.py]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s.Normalize("nlp", runtimeLimits())
	if s.Resources.GPUs != 1 || s.Resources.GPU != 0 {
		t.Fatalf("gpu alias: got gpus=%d gpu=%d", s.Resources.GPUs, s.Resources.GPU)
	}
	if err := s.Validate(runtimeLimits()); err != nil {
		t.Fatal(err)
	}
}
