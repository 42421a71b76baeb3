// Package ocitest gives tests of the oci runtime what no registry on the
// test machine can: a local image built from Debian's busybox-static, and
// a registry on 127.0.0.1 that serves it over the OCI distribution API.
package ocitest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// BusyboxPath is where Debian's busybox-static puts the binary.
const BusyboxPath = "/bin/busybox"

// Require skips the test unless the node can run the oci runtime (root,
// podman, runc, busybox-static); under CI=true it fails instead.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if _, err := os.Stat(BusyboxPath); err != nil {
		missing = append(missing, "busybox-static ("+BusyboxPath+")")
	}
	if len(missing) == 0 {
		return
	}
	msg := "the oci runtime tests need " + strings.Join(missing, ", ") + ": apt-get install podman runc busybox-static and run as root (.ci/run does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// ContainersConf writes the containers.conf a node needs (no default
// ulimits) and returns its path.
func ContainersConf(t testing.TB) string {
	t.Helper()
	p := t.TempDir() + "/containers.conf"
	if err := os.WriteFile(p, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	rootfsOnce sync.Once
	rootfs     []byte
	rootfsErr  error
)

// Rootfs is a tar of a minimal root filesystem: /bin/busybox, a link per
// applet, /tmp. The same bytes every time.
func Rootfs(t testing.TB) []byte {
	t.Helper()
	rootfsOnce.Do(func() { rootfs, rootfsErr = buildRootfs(nil) })
	if rootfsErr != nil {
		t.Fatal(rootfsErr)
	}
	return rootfs
}

// RootfsWithPadding is Rootfs plus a file of n pseudo-random bytes, to
// make an image big enough to watch a pull.
func RootfsWithPadding(t testing.TB, n int) []byte {
	t.Helper()
	pad := make([]byte, n)
	x := uint64(88172645463325252)
	for i := range pad {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		pad[i] = byte(x)
	}
	b, err := buildRootfs(pad)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func buildRootfs(pad []byte) ([]byte, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, err
	}
	list, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []string{"bin/", "tmp/", "etc/", "workspace/"}
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: mode}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, app := range strings.Fields(string(list)) {
		if app == "busybox" || strings.Contains(app, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + app, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
	if err := tw.WriteHeader(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(passwd))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write([]byte(passwd)); err != nil {
		return nil, err
	}
	if len(pad) > 0 {
		if err := tw.WriteHeader(&tar.Header{Name: "padding.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(pad))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(pad); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Podman runs podman with the node flags the runtime uses.
func Podman(conf string, args ...string) *exec.Cmd {
	cmd := exec.Command("podman", append([]string{"--cgroup-manager", "cgroupfs", "--runtime", "runc"}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	return cmd
}

// Busybox imports the busybox rootfs as a local image (once per content)
// and returns its name.
func Busybox(t testing.TB, conf string) string {
	t.Helper()
	fs := Rootfs(t)
	sum := sha256.Sum256(fs)
	name := "localhost/spillway-test/busybox:" + hex.EncodeToString(sum[:6])
	if Podman(conf, "image", "exists", name).Run() == nil {
		return name
	}
	f, err := os.CreateTemp("", "spillway-rootfs-*.tar")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(fs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := Podman(conf, "import", "--quiet", f.Name(), name).CombinedOutput(); err != nil {
		t.Fatalf("podman import: %v: %s", err, out)
	}
	return name
}

// Registry serves images over the OCI distribution API (pulls only) on
// 127.0.0.1. Gate, when set, is called while a blob is half sent, so a
// test can watch a pull in progress.
type Registry struct {
	*httptest.Server
	mu        sync.Mutex
	manifests map[string][]byte // "name:tag" → manifest
	blobs     map[string][]byte // digest → bytes
	Gate      func()
	// Deny answers 401 to every request for these names.
	Deny map[string]bool
}

// NewRegistry starts an empty registry.
func NewRegistry(t testing.TB) *Registry {
	r := &Registry{manifests: map[string][]byte{}, blobs: map[string][]byte{}, Deny: map[string]bool{}}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

// Host is the registry's host:port, for image references.
func (r *Registry) Host() string { return strings.TrimPrefix(r.URL, "http://") }

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// Push adds an image made of one uncompressed layer (a rootfs tar) and
// returns its reference.
func (r *Registry) Push(name, tag string, layer []byte) string {
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
	})
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(cfg), "size": len(cfg)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer), "size": len(layer)}},
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blobs[digest(cfg)] = cfg
	r.blobs[digest(layer)] = layer
	r.manifests[name+":"+tag] = man
	r.manifests[name+":"+digest(man)] = man
	return r.Host() + "/" + name + ":" + tag
}

func (r *Registry) serve(w http.ResponseWriter, req *http.Request) {
	p := req.URL.Path
	if p == "/v2/" || p == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		http.NotFound(w, req)
		return
	}
	r.mu.Lock()
	deny := false
	for n := range r.Deny {
		if strings.HasPrefix(rest, n+"/") {
			deny = true
		}
	}
	r.mu.Unlock()
	if deny {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
		return
	}
	if i := strings.LastIndex(rest, "/manifests/"); i >= 0 {
		key := rest[:i] + ":" + rest[i+len("/manifests/"):]
		r.mu.Lock()
		man, ok := r.manifests[key]
		r.mu.Unlock()
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}`)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", digest(man))
		w.Header().Set("Content-Length", fmt.Sprint(len(man)))
		if req.Method != http.MethodHead {
			w.Write(man)
		}
		return
	}
	if i := strings.LastIndex(rest, "/blobs/"); i >= 0 {
		d := rest[i+len("/blobs/"):]
		r.mu.Lock()
		b, ok := r.blobs[d]
		gate := r.Gate
		r.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}`)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Docker-Content-Digest", d)
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		if req.Method == http.MethodHead {
			return
		}
		if gate != nil && len(b) > 1<<20 {
			half := len(b) / 2
			w.Write(b[:half])
			w.(http.Flusher).Flush()
			gate()
			w.Write(b[half:])
			return
		}
		w.Write(b)
		return
	}
	http.NotFound(w, req)
}
