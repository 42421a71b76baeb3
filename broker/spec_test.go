package broker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func testLimits() SpecLimits {
	return SpecLimits{
		Queues: map[string]QueueLimits{
			"default":   {DefaultTimeout: 4 * time.Hour, MaxTimeout: 7 * 24 * time.Hour},
			"inference": {DefaultTimeout: time.Hour, MaxTimeout: 24 * time.Hour},
		},
		DefaultQueue:    "default",
		Priorities:      []string{"low", "medium", "high"},
		DefaultPriority: "medium",
		MaxGPUs:         8,
		MaxGPUMemory:    80 << 30,
		MaxNodes:        16,
	}
}

const goodSpec = `
name: finetune-chat
team: nlp
project: chat-v2
queue: default
priority: medium
resources:
  gpus: 1
  gpuMemory: 20Gi
  gpuModel: H100
  cpu: 8
  memory: 16Gi
  nodes: 1
timeout: 4h
restartPolicy: OnFailure
maxRetries: 3
preemptible: true
checkpoint: {signal: SIGUSR1, grace: 2m}
burst: allowed
command: ["python", "train.py", "--resume"]
env: {WANDB_MODE: offline}
`

func TestParseDesignSpec(t *testing.T) {
	s, err := ParseSpec([]byte(goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	s.Normalize("ignored", testLimits())
	if err := s.Validate(testLimits()); err != nil {
		t.Fatal(err)
	}
	want := Spec{
		Name: "finetune-chat", Team: "nlp", Project: "chat-v2", Queue: "default", Priority: "medium",
		Resources: Resources{GPUs: 1, GPUMemory: 20 << 30, GPUModel: "H100", CPU: 8, Memory: 16 << 30, Nodes: 1},
		Timeout:   Duration(4 * time.Hour), RestartPolicy: RestartOnFailure, MaxRetries: 3, Preemptible: true,
		Checkpoint: Checkpoint{Signal: "SIGUSR1", Grace: Duration(2 * time.Minute)}, Burst: BurstAllowed,
		Command: []string{"python", "train.py", "--resume"}, Env: map[string]string{"WANDB_MODE": "offline"},
	}
	if d := cmp.Diff(want, s); d != "" {
		t.Fatalf("spec (-want +got):\n%s", d)
	}
}

func TestDefaults(t *testing.T) {
	s, err := ParseSpec([]byte(`{"resources": {"gpus": 2}, "command": ["/usr/bin/python3", "x.py"]}`))
	if err != nil {
		t.Fatal(err)
	}
	s.Normalize("vision", testLimits())
	if err := s.Validate(testLimits()); err != nil {
		t.Fatal(err)
	}
	if s.Name != "python3" || s.Team != "vision" || s.Queue != "default" || s.Priority != "medium" ||
		s.Timeout.D() != 4*time.Hour || s.Resources.Nodes != 1 || s.RestartPolicy != RestartNever ||
		s.Checkpoint.Signal != "SIGTERM" || s.Checkpoint.Grace.D() != 30*time.Second || s.Burst != BurstAllowed {
		t.Fatalf("defaults not applied: %+v", s)
	}
}

// TestBadSpecs: every rejection names the field and the rule.
func TestBadSpecs(t *testing.T) {
	base := func(extra string) string {
		return "resources: {gpus: 1}\ncommand: [\"true\"]\n" + extra
	}
	huge := strings.Repeat("a", MaxSpecBytes)
	cases := []struct {
		name  string
		doc   string
		field string
		code  string
	}{
		{"empty document", "", "", CodeMalformed},
		{"not yaml", "resources: [gpus: 1", "", CodeMalformed},
		{"a list, not an object", "- a\n- b", "", CodeWrongType},
		{"over 256 KiB", "name: " + huge, "", CodeTooLarge},
		{"invalid utf-8", "name: \xff\xfe", "", CodeMalformed},
		{"unknown top-level field", base("colour: blue"), "colour", CodeUnknownField},
		{"unknown nested field", "resources: {gpus: 1, gpuCount: 2}\ncommand: [x]", "resources.gpuCount", CodeUnknownField},
		{"field name case differs", base("Name: x"), "Name", CodeUnknownField},
		{"zero gpus", "resources: {gpus: 0}\ncommand: [x]", "resources.gpus", CodeOutOfRange},
		{"missing gpus", "command: [x]", "resources.gpus", CodeOutOfRange},
		{"ten thousand gpus", "resources: {gpus: 10000}\ncommand: [x]", "resources.gpus", CodeOutOfRange},
		{"negative gpus", "resources: {gpus: -1}\ncommand: [x]", "resources.gpus", CodeOutOfRange},
		{"gpus as string", "resources: {gpus: \"two\"}\ncommand: [x]", "resources.gpus", CodeWrongType},
		{"gpus fractional", "resources: {gpus: 1.5}\ncommand: [x]", "resources.gpus", CodeWrongType},
		{"gpus overflow", "resources: {gpus: 99999999999999999999}\ncommand: [x]", "resources.gpus", CodeWrongType},
		{"zero nodes after explicit negative", "resources: {gpus: 1, nodes: -2}\ncommand: [x]", "resources.nodes", CodeOutOfRange},
		{"too many nodes", "resources: {gpus: 1, nodes: 17}\ncommand: [x]", "resources.nodes", CodeOutOfRange},
		{"gpu memory above the largest card", "resources: {gpus: 1, gpuMemory: 200Gi}\ncommand: [x]", "resources.gpuMemory", CodeOutOfRange},
		{"gpu memory garbage", "resources: {gpus: 1, gpuMemory: lots}\ncommand: [x]", "resources.gpuMemory", CodeInvalid},
		{"gpu memory tiny", "resources: {gpus: 1, gpuMemory: 10}\ncommand: [x]", "resources.gpuMemory", CodeOutOfRange},
		{"gang with sharing", "resources: {gpus: 8, nodes: 2, gpuMemory: 20Gi}\ncommand: [x]", "resources.gpuMemory", CodeNotAllowed},
		{"gpu model with slash", "resources: {gpus: 1, gpuModel: \"H100/../x\"}\ncommand: [x]", "resources.gpuModel", CodeInvalid},
		{"negative cpu", "resources: {gpus: 1, cpu: -4}\ncommand: [x]", "resources.cpu", CodeOutOfRange},
		{"memory garbage", "resources: {gpus: 1, memory: 16Gx}\ncommand: [x]", "resources.memory", CodeInvalid},
		{"resources not an object", "resources: 4\ncommand: [x]", "resources", CodeWrongType},
		{"unknown queue", base("queue: gpu-fast"), "queue", CodeInvalid},
		{"unknown priority", base("priority: urgent"), "priority", CodeInvalid},
		{"zero timeout", base("timeout: 0s"), "timeout", CodeOutOfRange},
		{"negative timeout", base("timeout: -5m"), "timeout", CodeOutOfRange},
		{"timeout past queue max", base("queue: inference\ntimeout: 2d"), "timeout", CodeOutOfRange},
		{"timeout garbage", base("timeout: soon"), "timeout", CodeInvalid},
		{"bad restart policy", base("restartPolicy: Always"), "restartPolicy", CodeInvalid},
		{"retries without OnFailure", base("maxRetries: 3"), "maxRetries", CodeNotAllowed},
		{"retries negative", base("restartPolicy: OnFailure\nmaxRetries: -1"), "maxRetries", CodeOutOfRange},
		{"retries huge", base("restartPolicy: OnFailure\nmaxRetries: 1000"), "maxRetries", CodeOutOfRange},
		{"preemptible as string", base("preemptible: \"maybe\""), "preemptible", CodeWrongType},
		{"bad checkpoint signal", base("checkpoint: {signal: SIGSTOP}"), "checkpoint.signal", CodeInvalid},
		{"checkpoint grace too long", base("checkpoint: {grace: 3h}"), "checkpoint.grace", CodeOutOfRange},
		{"bad burst", base("burst: always"), "burst", CodeInvalid},
		{"no command", "resources: {gpus: 1}", "command", CodeRequired},
		{"command as a string (shell)", "resources: {gpus: 1}\ncommand: \"python train.py && rm -rf /\"", "command", CodeWrongType},
		{"empty argv0", "resources: {gpus: 1}\ncommand: [\"\", x]", "command[0]", CodeRequired},
		{"command with number", "resources: {gpus: 1}\ncommand: [python, 3]", "command[1]", CodeWrongType},
		{"NUL in argument", "resources: {gpus: 1}\ncommand: [\"a\\0b\"]", "command[0]", CodeInvalid},
		{"argument too long", fmt.Sprintf("resources: {gpus: 1}\ncommand: [%q]", strings.Repeat("x", 40<<10)), "command[0]", CodeTooLong},
		{"env value not a string", base("env: {N: 3}"), "env.N", CodeWrongType},
		{"env bad key", base("env: {\"1BAD\": x}"), "env.1BAD", CodeInvalid},
		{"env overrides CUDA_VISIBLE_DEVICES", base("env: {CUDA_VISIBLE_DEVICES: \"0\"}"), "env.CUDA_VISIBLE_DEVICES", CodeNotAllowed},
		{"env uses reserved prefix", base("env: {SPILLWAY_JOB_ID: x}"), "env.SPILLWAY_JOB_ID", CodeNotAllowed},
		{"name with spaces", base("name: \"my job\""), "name", CodeInvalid},
		{"name with shell metachars", base("name: \"$(reboot)\""), "name", CodeInvalid},
		{"name too long", base("name: " + strings.Repeat("n", 64)), "name", CodeTooLong},
		{"team hostile", base("team: \"../../etc\""), "team", CodeInvalid},
		{"project with newline", base("project: \"a\\nb\""), "project", CodeInvalid},
		{"relative workdir", base("workdir: tmp/x"), "workdir", CodeInvalid},
	}
	if len(cases) < 30 {
		t.Fatalf("want at least 30 bad-spec cases, have %d", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec([]byte(tc.doc))
			if err == nil {
				s.Normalize("nlp", testLimits())
				err = s.Validate(testLimits())
			}
			ve, ok := AsValidation(err)
			if !ok {
				t.Fatalf("want a validation error, got %v", err)
			}
			got := ve.First()
			if got.Field != tc.field || got.Code != tc.code {
				t.Fatalf("first error = %+v, want field %q code %q (all: %v)", got, tc.field, tc.code, ve)
			}
			if got.Message == "" {
				t.Fatal("empty message")
			}
		})
	}
}

func TestUnknownFieldListsKnown(t *testing.T) {
	_, err := ParseSpec([]byte("resources: {gpuCount: 1}\ncommand: [x]"))
	ve, _ := AsValidation(err)
	if !strings.Contains(ve.First().Message, "gpus") {
		t.Fatalf("message should list the known fields: %q", ve.First().Message)
	}
}

func TestQuantityAndDurationRoundTrip(t *testing.T) {
	for in, want := range map[string]int64{"16Gi": 16 << 30, "512Mi": 512 << 20, "80G": 80e9, "1.5Gi": 3 << 29, "1024": 1024, "80GB": 80e9} {
		got, err := ParseQuantity(in)
		if err != nil || got != want {
			t.Errorf("ParseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, want := range map[string]string{"4h": "4h", "90s": "1m30s", "2d": "2d", "1h30m": "1h30m", "150ms": "150ms"} {
		d, err := ParseDuration(in)
		if err != nil || FormatDuration(d) != want {
			t.Errorf("duration %q → %q, %v; want %q", in, FormatDuration(d), err, want)
		}
	}
}

func TestAliasBombRejected(t *testing.T) {
	doc := "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
	prev := "a"
	for i := 0; i < 8; i++ {
		name := fmt.Sprintf("l%d", i)
		doc += fmt.Sprintf("%s: &%s [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", name, name, prev, prev, prev, prev, prev, prev, prev, prev, prev, prev)
		prev = name
	}
	_, err := ParseSpec([]byte(doc))
	ve, ok := AsValidation(err)
	if !ok || ve.First().Code != CodeMalformed {
		t.Fatalf("alias bomb: %v", err)
	}
}
