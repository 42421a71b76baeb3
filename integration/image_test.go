package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/runtime/ocitest"
	"github.com/spillway-dev/spillway/onprem/wire"
)

// TestContainerImage builds the broker's image as an operator would (`make
// image`: the Containerfile over a prebuilt binary, no network) on a base
// the test makes from a local rootfs in place of distroless (the binary's
// shared libraries from ldd, /etc/passwd with nonroot), then runs it with
// rootful podman (cgroupfs, runc, no default ulimits): `--version`, and
// the broker itself with a mounted config serving HTTPS on a published
// port, whose /healthz the test GETs from the host.
func TestContainerImage(t *testing.T) {
	requirePodman(t)
	conf := ocitest.ContainersConf(t)
	podman := func(args ...string) *exec.Cmd { return ocitest.Podman(conf, args...) }
	base := localBase(t, conf)

	tag := fmt.Sprintf("localhost/spillway-test/broker:%d", os.Getpid())
	build := exec.Command("make", "--no-print-directory", "image",
		"IMAGE_BINARY="+bin, "IMAGE_ARCH="+runtime.GOARCH, "IMAGE_BASE="+base, "IMAGE_TAG="+tag,
		"IMAGE_CONTEXT="+filepath.Join(t.TempDir(), "image"),
		"PODMAN=podman --cgroup-manager cgroupfs --runtime runc")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = podman("rmi", "--force", tag).Run() })

	var inspect []struct {
		Architecture string
		Config       struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Volumes    map[string]struct{}
		}
	}
	out, err := podman("image", "inspect", tag).Output()
	if err != nil || json.Unmarshal(out, &inspect) != nil || len(inspect) != 1 {
		t.Fatalf("podman image inspect %s: %v\n%s", tag, err, out)
	}
	img := inspect[0].Config
	if inspect[0].Architecture != runtime.GOARCH {
		t.Errorf("image architecture %q, the binary's is %s", inspect[0].Architecture, runtime.GOARCH)
	}
	if img.User != "nonroot:nonroot" || strings.Join(img.Entrypoint, " ") != "/usr/bin/spillway" ||
		strings.Join(img.Cmd, " ") != "server --config /etc/spillway/spillway.yaml" {
		t.Errorf("image runs %v %v as %q; want /usr/bin/spillway server --config /etc/spillway/spillway.yaml as nonroot", img.Entrypoint, img.Cmd, img.User)
	}
	if _, ok := img.Volumes["/var/lib/spillway"]; !ok {
		t.Errorf("image volumes %v lack /var/lib/spillway", img.Volumes)
	}

	// --version: the image's binary is the one it was built from.
	want, err := exec.Command(bin, "--version").Output()
	if err != nil && len(want) == 0 {
		t.Fatalf("spillway --version on the host: %v", err)
	}
	got, _ := podman("run", "--rm", "--network", "none", tag, "--version").CombinedOutput()
	if first := strings.SplitN(string(want), "\n", 2)[0]; !strings.HasPrefix(string(got), first+"\n") {
		t.Fatalf("podman run %s --version printed %q, want %q first", tag, got, first)
	}

	// The broker: the config, its certificate and key mounted read-only
	// at /etc/spillway, state in the image's volume, HTTPS on a port
	// published to the host's loopback.
	etc := t.TempDir()
	caPEM, caKey, err := wire.NewCA("spillway image test CA", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca, key, err := wire.ParseCAPair(caPEM, caKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := wire.IssueServerCert(ca, key, []string{"127.0.0.1", "localhost"}, time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	opsHash := sha256.Sum256([]byte(tokAdmin))
	files := map[string]string{
		"tls/ca.pem":         string(caPEM),
		"tls/server.pem":     string(certPEM),
		"tls/server-key.pem": string(keyPEM),
		"spillway.yaml": fmt.Sprintf(`listen: 0.0.0.0:8080
dataDir: /var/lib/spillway
tls: {certFile: /etc/spillway/tls/server.pem, keyFile: /etc/spillway/tls/server-key.pem, caFile: /etc/spillway/tls/ca.pem}
auth:
  tokens:
    - {name: ops, role: operator, tokenSHA256: %s}
`, hex.EncodeToString(opsHash[:])),
	}
	for name, body := range files {
		p := filepath.Join(etc, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		// Readable by the image's nonroot user (a test file; a real key
		// is 0640 with the container user's group).
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	_, portNum, _ := net.SplitHostPort(port)
	name := fmt.Sprintf("spillway-image-test-%d", os.Getpid())
	run := podman("run", "-d", "--rm", "--name", name, "-v", etc+":/etc/spillway:ro",
		"-p", "127.0.0.1:"+portNum+":8080", tag, "server", "--config", "/etc/spillway/spillway.yaml")
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("podman run %s server: %v\n%s", tag, err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := podman("logs", name).CombinedOutput()
			t.Logf("broker in the container:\n%s", logs)
		}
		_ = podman("rm", "--force", "--time", "10", name).Run()
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://127.0.0.1:" + portNum + "/healthz"
	var health struct {
		Status, Version string
		Leader          bool
	}
	var lastErr error
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		resp, err := hc.Get(url)
		if err == nil {
			lastErr = json.NewDecoder(resp.Body).Decode(&health)
			resp.Body.Close()
			if lastErr == nil && resp.StatusCode == http.StatusOK {
				break
			}
			lastErr = fmt.Errorf("status %d, decode %v", resp.StatusCode, lastErr)
		} else {
			lastErr = err
		}
		if state, _ := podman("inspect", "--format", "{{.State.Status}}", name).Output(); !strings.Contains(string(state), "running") {
			t.Fatalf("the broker's container is %s, not running", strings.TrimSpace(string(state)))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if health.Status != "ok" || !health.Leader {
		t.Fatalf("GET %s from the host: %+v, last error %v", url, health, lastErr)
	}
	if !strings.Contains(string(want), "spillway "+health.Version+" ") {
		t.Errorf("the broker in the container reports version %q; the binary is %q", health.Version, want)
	}
	// The broker opened its store in the image's volume as nonroot (it
	// does not serve without one), so the volume starts out as its own.
	logs, _ := podman("logs", name).CombinedOutput()
	if !strings.Contains(string(logs), "broker serving") {
		t.Errorf("the broker's log lacks \"broker serving\":\n%s", logs)
	}
}

// requirePodman skips unless rootful podman with runc can run here; under
// CI=true it fails instead (.ci/run installs podman and runc).
func requirePodman(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, b := range []string{"podman", "runc", "make", "ldd"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "the container image test needs " + strings.Join(missing, ", ") + ": apt-get install podman runc and run as root (.ci/run does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// localBase imports, once per content, a base image standing in for
// distroless base-debian12:nonroot: the shared libraries the binary links
// (ldd), /etc/passwd and /etc/group with root and nonroot (65532), /tmp and
// nonroot's home. It returns the image's name.
func localBase(t *testing.T, conf string) string {
	t.Helper()
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	addDir := func(name string, mode int64, uid int) {
		if dirs[name] {
			return
		}
		dirs[name] = true
		if err := tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: mode, Uid: uid, Gid: uid}); err != nil {
			t.Fatal(err)
		}
	}
	var mkdirs func(dir string)
	mkdirs = func(dir string) {
		if dir == "." || dir == "/" || dir == "" {
			return
		}
		mkdirs(filepath.Dir(dir))
		addDir(dir, 0o755, 0)
	}
	addFile := func(name string, body []byte, mode int64) {
		mkdirs(filepath.Dir(name))
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	libs := 0
	for _, line := range strings.Split(string(out), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
		f := strings.Fields(line)
		path := ""
		switch {
		case len(f) >= 3 && f[1] == "=>":
			path = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			path = f[0]
		}
		if !strings.HasPrefix(path, "/") {
			continue
		}
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read %s (ldd %s): %v", path, bin, err)
		}
		addFile(strings.TrimPrefix(path, "/"), body, 0o755)
		libs++
	}
	if libs == 0 {
		t.Fatalf("ldd %s named no libraries:\n%s", bin, out)
	}
	addFile("etc/passwd", []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), 0o644)
	addFile("etc/group", []byte("root:x:0:\nnonroot:x:65532:\n"), 0o644)
	addDir("tmp", 0o1777, 0)
	addDir("home", 0o755, 0)
	addDir("home/nonroot", 0o700, 65532)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	name := "localhost/spillway-test/base-nonroot:" + hex.EncodeToString(sum[:6])
	if ocitest.Podman(conf, "image", "exists", name).Run() == nil {
		return name
	}
	f := filepath.Join(t.TempDir(), "base.tar")
	if err := os.WriteFile(f, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := ocitest.Podman(conf, "import", "--quiet", f, name).CombinedOutput(); err != nil {
		t.Fatalf("podman import: %v: %s", err, out)
	}
	return name
}
