package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDebInstalls unpacks the .deb `make dist` built for this machine's
// architecture into a throwaway root (dpkg-deb -x, as dpkg would lay it
// out) and checks what a package install gives: the binary with the
// package's version, the systemd units pointing at it and at docs that
// are there, the docs, the config examples and the license, and the
// postinst that makes the user and dirs. .ci/run runs `make dist` first;
// elsewhere the test skips until dist/ has a .deb.
func TestDebInstalls(t *testing.T) {
	debs, _ := filepath.Glob("../dist/spillway_*_" + runtime.GOARCH + ".deb")
	if len(debs) == 0 {
		msg := "no dist/spillway_*_" + runtime.GOARCH + ".deb: run `make dist` (or `make dist DIST_ARCHES=" + runtime.GOARCH + "`) first"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	deb := debs[len(debs)-1]
	field := func(name string) string {
		out, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if field("Package") != "spillway" || field("Architecture") != runtime.GOARCH {
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
	if fi, err := os.Stat(filepath.Join(root, "usr/bin/spillway")); err == nil && fi.Mode().Perm() != 0o755 {
		t.Errorf("/usr/bin/spillway mode %v", fi.Mode())
	}
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
	out, err := exec.Command(filepath.Join(root, "usr/bin/spillway"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("spillway --version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "spillway "+version+" linux/"+runtime.GOARCH) {
		t.Fatalf("spillway --version printed %q, the package is %s", out, version)
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
