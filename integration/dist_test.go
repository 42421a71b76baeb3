package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/toolbin"
)

// TestDebInstalls unpacks the .deb packages `make dist` built (dpkg-deb
// -x, as dpkg would lay them out) into throwaway roots and checks what a
// package install gives: the binary with the package's version, built for
// the package's architecture (debug/elf: x86-64 for amd64, AArch64 for
// arm64), the systemd units pointing at it and at docs that are there, the
// docs, the config examples and the license, and the postinst that makes
// the user and dirs. The package of this machine's architecture runs
// `--version`. The release archives hold the same binary and files.
// .ci/run runs `make dist` for both architectures first; elsewhere an
// architecture skips until dist/ has its .deb.
func TestDebInstalls(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			debs, _ := filepath.Glob("../dist/spillway_*_" + arch + ".deb")
			if len(debs) == 0 {
				msg := "no dist/spillway_*_" + arch + ".deb: run `make dist` (or `make dist DIST_ARCHES=" + arch + "`) first"
				if os.Getenv("CI") == "true" {
					t.Fatal(msg)
				}
				t.Skip(msg)
			}
			checkDeb(t, debs[len(debs)-1], arch)
		})
	}
}

// elfMachine is the ELF machine of each package architecture.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func checkDeb(t *testing.T, deb, arch string) {
	field := func(name string) string {
		out, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if field("Package") != "spillway" || field("Architecture") != arch {
		t.Fatalf("package %q architecture %q", field("Package"), field("Architecture"))
	}
	version := field("Version")
	root := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
	}
	ctl := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-e", deb, ctl).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -e: %v\n%s", err, out)
	}
	for _, f := range []string{
		"usr/bin/spillway",
		"lib/systemd/system/spillway-server.service",
		"lib/systemd/system/spillway-agent.service",
		"usr/share/doc/spillway/copyright",
		"usr/share/doc/spillway/README.md",
		"usr/share/doc/spillway/operations.md",
		"usr/share/doc/spillway/providers.md",
		"usr/share/doc/spillway/billing.md",
		"usr/share/doc/spillway/config.md",
		"usr/share/doc/spillway/openapi.yaml",
		"usr/share/doc/spillway/examples/spillway.example.yaml",
		"usr/share/doc/spillway/examples/ha/spillway.yaml",
		"usr/share/doc/spillway/examples/aws/iam-policy.json",
	} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("the package lacks /%s", f)
		}
	}
	binary := filepath.Join(root, "usr/bin/spillway")
	if fi, err := os.Stat(binary); err == nil && fi.Mode().Perm() != 0o755 {
		t.Errorf("/usr/bin/spillway mode %v", fi.Mode())
	}
	checkELF(t, binary, arch)
	for _, unit := range []string{"spillway-server.service", "spillway-agent.service"} {
		raw, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system", unit))
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "ExecStart="); ok && !strings.HasPrefix(v, "/usr/bin/spillway ") {
				t.Errorf("%s: ExecStart=%s does not run the packaged binary", unit, v)
			}
			if v, ok := strings.CutPrefix(line, "Documentation=file://"); ok {
				if _, err := os.Stat(filepath.Join(root, v)); err != nil {
					t.Errorf("%s: Documentation=%s is not in the package", unit, v)
				}
			}
		}
	}
	if lic, _ := os.ReadFile(filepath.Join(root, "usr/share/doc/spillway/copyright")); !strings.Contains(string(lic), "Apache License") {
		t.Error("copyright is not the Apache License")
	}
	if post, err := os.ReadFile(filepath.Join(ctl, "postinst")); err != nil || !strings.Contains(string(post), "useradd --system") {
		t.Errorf("postinst: %v", err)
	}
	checkArchive(t, arch, version, binary)
	if arch != runtime.GOARCH {
		return // built for another machine: its ELF header is what can be checked here
	}
	out, err := exec.Command(binary, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("spillway --version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "spillway "+version+" linux/"+arch) {
		t.Fatalf("spillway --version printed %q, the package is %s", out, version)
	}
}

// checkELF: the binary is a 64-bit little-endian Linux executable for
// arch's machine.
func checkELF(t *testing.T, path, arch string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s is not an ELF file: %v", path, err)
	}
	defer f.Close()
	if f.Machine != elfMachine[arch] || f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		t.Errorf("the %s package's binary is %v %v %v %v, want %v ELFCLASS64 ELFDATA2LSB, an executable", arch, f.Machine, f.Class, f.Data, f.Type, elfMachine[arch])
	}
}

// checkArchive: dist/spillway_VERSION_linux_ARCH.tar.gz holds the
// package's binary (the same bytes), the license, the README, the docs
// and the deploy files.
func checkArchive(t *testing.T, arch, version, binary string) {
	t.Helper()
	name := "../dist/spillway_" + version + "_linux_" + arch + ".tar.gz"
	f, err := os.Open(name)
	if err != nil {
		t.Errorf("no release archive next to the package: %v", err)
		return
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	want, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		p := strings.TrimPrefix(h.Name, "./")
		seen[p] = true
		if p == "spillway" {
			got, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: its spillway differs from the package's /usr/bin/spillway", name)
			}
			if h.Mode&0o111 == 0 {
				t.Errorf("%s: spillway is not executable (mode %o)", name, h.Mode)
			}
		}
	}
	for _, f := range []string{"spillway", "LICENSE", "README.md", "docs/operations.md", "docs/openapi.yaml",
		"deploy/spillway.example.yaml", "deploy/systemd/spillway-server.service"} {
		if !seen[f] {
			t.Errorf("%s lacks %s", name, f)
		}
	}
}

// TestPackagedUnitsMatch: the package's systemd units are the hand-install
// units of deploy/systemd with the binary at /usr/bin, so the two never
// drift apart.
func TestPackagedUnitsMatch(t *testing.T) {
	for _, unit := range []string{"spillway-server.service", "spillway-agent.service"} {
		hand, err := os.ReadFile("../deploy/systemd/" + unit)
		if err != nil {
			t.Fatal(err)
		}
		pkg, err := os.ReadFile("../deploy/package/" + unit)
		if err != nil {
			t.Fatal(err)
		}
		body := func(raw []byte) string {
			s := string(raw)
			return s[strings.Index(s, "[Unit]"):]
		}
		if want := strings.ReplaceAll(body(hand), "/usr/local/bin/spillway", "/usr/bin/spillway"); body(pkg) != want {
			t.Errorf("deploy/package/%s differs from deploy/systemd/%s beyond the binary's path; regenerate it:\n"+
				"  sed 's#/usr/local/bin/spillway#/usr/bin/spillway#' (from the [Unit] line)", unit, unit)
		}
	}
}

// goreleaser is the release tool `make dist` runs (Makefile's
// GORELEASER_VERSION; make goreleaser and .ci/run build it into the tool
// cache; it is too big to build inside a test).
var goreleaser = &toolbin.Tool{Name: "goreleaser", Env: "SPILLWAY_GORELEASER", Module: "github.com/goreleaser/goreleaser/v2", Version: "v2.15.1"}

// TestGoreleaserRelease: goreleaser accepts .goreleaser.yaml (`goreleaser
// check`), and when dist/ is goreleaser's (make dist with goreleaser
// installed, as in .ci/run) its artifacts are the archive and the .deb for
// linux/amd64 and linux/arm64 that TestDebInstalls unpacks.
func TestGoreleaserRelease(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "\nGORELEASER_VERSION := "+goreleaser.Version+"\n") {
		t.Fatalf("the Makefile's GORELEASER_VERSION is not %s, the version this test runs", goreleaser.Version)
	}
	gr, ok := goreleaser.Installed()
	if !ok {
		msg := "goreleaser " + goreleaser.Version + " is not installed: `make goreleaser` builds it into " + goreleaser.CacheDir()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	check := exec.Command(gr, "check")
	check.Dir = ".."
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("goreleaser check: %v\n%s", err, out)
	}

	raw, err := os.ReadFile("../dist/artifacts.json")
	if err != nil {
		msg := "dist/ was not made by goreleaser (no dist/artifacts.json): run `make dist` with goreleaser installed"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	var artifacts []struct{ Name, Path, Goos, Goarch, Type string }
	if err := json.Unmarshal(raw, &artifacts); err != nil {
		t.Fatalf("dist/artifacts.json: %v", err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		for _, want := range []struct{ typ, suffix string }{{"Archive", ".tar.gz"}, {"Linux Package", ".deb"}} {
			found := false
			for _, a := range artifacts {
				if a.Type == want.typ && a.Goos == "linux" && a.Goarch == arch && strings.HasSuffix(a.Name, want.suffix) {
					found = true
					if _, err := os.Stat(filepath.Join("..", a.Path)); err != nil {
						t.Errorf("goreleaser lists %s but it is not there: %v", a.Path, err)
					}
				}
			}
			if !found {
				t.Errorf("goreleaser made no %s (%s) for linux/%s", want.typ, want.suffix, arch)
			}
		}
	}
}
