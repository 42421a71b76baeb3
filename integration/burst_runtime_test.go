package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/runtime/ocitest"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestBurstRunImageWithWorkdir: the on-prem card is taken, so `spillway
// run --image … -- sh -c 'cat input.txt'` from a laptop directory bursts
// to a machine of the fake EC2 (a real sshd host); its agent, bootstrapped
// with the oci runtime configured for the provider and told to pre-pull
// the queue's image, fetches the uploaded directory and runs the job in
// the image.
func TestBurstRunImageWithWorkdir(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ocitest.Require(t)
	conf := ocitest.ContainersConf(t)
	img := ocitest.Busybox(t, conf)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	remote := burstHostDir(t)
	// The machine stays while the test reads its agent config.
	c := burstCluster(t, ec2, remote, withIdleTTL("30s"),
		withBurst(fmt.Sprintf("providerRuntimes: {aws-fake: {kind: oci, podman: {containersConf: %q}}}", conf)))
	c.agent("onprem-1", "sim:1xH100-80GB")
	c.waitNodes(1)
	c.holdCard(tokAlice, "hold")

	out, errOut, code := c.cliIn(codeDir(t), tokAlice, "run", "--image", img, "--gpus", "1", "--time", "5m", "--wait", "--",
		"sh", "-c", "cat input.txt; id -u; cat /proc/1/cgroup | grep -c libpod")
	if code != 0 || !strings.Contains(out, "hello from the laptop") {
		t.Fatalf("burst run: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "provisioning") {
		t.Fatalf("the job did not burst:\n%s", errOut)
	}
	if strings.Contains(out, "\n0\n") {
		t.Fatalf("the job ran as root on the burst machine: %q", out)
	}
	// The bootstrap wrote the provider's runtime and the image to
	// pre-pull into the machine's agent config.
	var cfgs []string
	filepath.Walk(remote, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(p, ".yaml") {
			raw, _ := os.ReadFile(p)
			cfgs = append(cfgs, string(raw))
		}
		return nil
	})
	joined := strings.Join(cfgs, "\n---\n")
	if !strings.Contains(joined, "kind: oci") || !strings.Contains(joined, img) {
		t.Fatalf("the burst agent's config lacks the oci runtime or the pre-pull of %s:\n%s", img, joined)
	}
}
