package bootstrap

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
)

func TestPlatformOf(t *testing.T) {
	for uname, want := range map[string]string{
		"Linux x86_64\n": "linux/amd64",
		"Linux aarch64":  "linux/arm64",
		"Darwin arm64":   "darwin/arm64",
		"Linux riscv64":  "linux/riscv64",
		"garbage":        "unknown/garbage",
	} {
		if got := platformOf(uname); got != want {
			t.Errorf("platformOf(%q) = %q, want %q", uname, got, want)
		}
	}
}

func TestPickBinary(t *testing.T) {
	here := runtime.GOOS + "/" + runtime.GOARCH
	opts := Options{Executable: "/usr/local/bin/spillway", Binaries: map[string]string{"linux/arm64": "/dist/spillway-linux-arm64"}}
	cases := []struct {
		name, platform, want string
		err                  error
	}{
		{"the running binary when the platform matches", here, "/usr/local/bin/spillway", nil},
		{"the configured binary for another platform", "linux/arm64", "/dist/spillway-linux-arm64", nil},
		{"an error when none is configured", "linux/s390x", "", ErrNoBinary},
	}
	if here == "linux/arm64" {
		cases[0].want = "/dist/spillway-linux-arm64"
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := pickBinary(c.platform, opts)
			if !errors.Is(err, c.err) || got != c.want {
				t.Errorf("pickBinary(%q) = %q, %v; want %q, %v", c.platform, got, err, c.want, c.err)
			}
		})
	}
}

func TestShellQuoteSurvivesQuotes(t *testing.T) {
	if got, want := shellQuote(`/opt/it's here`), `'/opt/it'\''s here'`; got != want {
		t.Errorf("shellQuote = %s, want %s", got, want)
	}
}

func TestHostKeyAlgorithmsFollowTheVouchedKeys(t *testing.T) {
	k, _, _, _, err := ssh.ParseAuthorizedKey([]byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ssh-ed25519"}, HostKeyAlgorithms([]ssh.PublicKey{k, k})); diff != "" {
		t.Error(diff)
	}
}

func TestUnitRunsTheAgentWithItsConfig(t *testing.T) {
	u := unit(newLayout("/opt/spillway"), AgentConfig{Name: "i-1"})
	for _, want := range []string{
		"ExecStart=/opt/spillway/bin/spillway agent --config /opt/spillway/agent.yaml",
		"Restart=always",
		"WantedBy=multi-user.target",
	} {
		if !strings.Contains(u, want) {
			t.Errorf("unit lacks %q:\n%s", want, u)
		}
	}
}

func TestAgentConfigValidation(t *testing.T) {
	good := AgentConfig{Broker: "http://10.0.0.1:8080", Token: "t", Name: "i-0abc", GPUs: "auto", DataDir: "/var/lib/spillway"}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for name, mutate := range map[string]func(*AgentConfig){
		"broker":  func(c *AgentConfig) { c.Broker = "10.0.0.1:8080" },
		"token":   func(c *AgentConfig) { c.Token = "" },
		"name":    func(c *AgentConfig) { c.Name = "has space" },
		"gpus":    func(c *AgentConfig) { c.GPUs = "sim:many" },
		"dataDir": func(c *AgentConfig) { c.DataDir = "relative/dir" },
	} {
		c := good
		mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("bad %s: err = %v, want one naming the field", name, err)
		}
	}
	b, err := good.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseAgentConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(good, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, err := ParseAgentConfig(append(b, []byte("extra: 1\n")...)); err == nil {
		t.Error("unknown field accepted")
	}
}
