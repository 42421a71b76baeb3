package server

import (
	"fmt"
	"github.com/spillway-dev/spillway/broker/api"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/config"
)

// TestReloadAppliesLiveSectionsAndRefusesBadFiles: a reload puts the live
// sections in force at once, lists the restart-only ones that changed,
// and a file that fails validation changes nothing; both are audited.
func TestReloadAppliesLiveSectionsAndRefusesBadFiles(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(t.TempDir(), "spillway.yaml")
	dataDir := t.TempDir()
	write := func(listen string, perMinute int) {
		raw := fmt.Sprintf("listen: %s\ndataDir: %s\ntls: {insecure: true}\nlimits: {submitsPerMinute: %d}\nauth:\n  tokens:\n    - {name: admin, role: operator, token: %s}\n",
			listen, dataDir, perMinute, tokAdmin)
		if err := os.WriteFile(file, []byte(raw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("127.0.0.1:8080", 600)
	h.srv.initReload(file)

	write("127.0.0.1:9090", 5)
	var res api.ReloadResult
	if code := h.do("POST", "/v1/config/reload", tokAdmin, nil, &res); code != http.StatusOK {
		t.Fatalf("reload: %d", code)
	}
	if !strings.Contains(strings.Join(res.Applied, ","), "limits") || !strings.Contains(strings.Join(res.RestartNeeded, ","), "listen") || strings.Contains(strings.Join(res.RestartNeeded, ","), "limits") {
		t.Fatalf("applied %v, restart needed %v", res.Applied, res.RestartNeeded)
	}
	if got := h.srv.cfg().Limits.SubmitsPerMinute; got != 5 {
		t.Fatalf("limits.submitsPerMinute in force: %d", got)
	}

	write("127.0.0.1:9090", -1)
	var bad errorBody
	if code := h.do("POST", "/v1/config/reload", tokAdmin, nil, &bad); code != http.StatusBadRequest || !strings.Contains(bad.Error.Field+bad.Error.Message, "submitsPerMinute") {
		t.Fatalf("bad file: %d %+v", code, bad.Error)
	}
	if got := h.srv.cfg().Limits.SubmitsPerMinute; got != 5 {
		t.Fatalf("a refused file changed limits.submitsPerMinute to %d", got)
	}
	if code := h.do("POST", "/v1/config/reload", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user reloaded the config: %d", code)
	}
	assertAudit(t, h, "config.reload")
}

// TestReloadCoversEveryConfigKey: every top-level key of the config file
// is either live or listed as needing a restart.
func TestReloadCoversEveryConfigKey(t *testing.T) {
	known := map[string]bool{}
	for _, s := range configSections {
		known[s.key] = true
	}
	ty := reflect.TypeOf(config.Config{})
	for i := range ty.NumField() {
		f := ty.Field(i)
		if !f.IsExported() {
			continue
		}
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !known[key] {
			t.Errorf("config key %s is in neither list of reload.go's configSections", key)
		}
	}
}

// TestReloadReportsOnlyWhatTheOperatorChanged: a file whose only change is
// listen reports listen alone as needing a restart, not advertiseURL and
// ha too (their defaults derive from listen), and applies nothing; the
// same file reloaded again reports nothing.
func TestReloadReportsOnlyWhatTheOperatorChanged(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(t.TempDir(), "spillway.yaml")
	dataDir := t.TempDir()
	write := func(listen string) {
		raw := fmt.Sprintf("listen: %s\ndataDir: %s\ntls: {insecure: true}\nauth:\n  tokens:\n    - {name: admin, role: operator, token: %s}\n",
			listen, dataDir, tokAdmin)
		if err := os.WriteFile(file, []byte(raw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("127.0.0.1:8080")
	h.srv.initReload(file)
	write("0.0.0.0:9090")
	var res api.ReloadResult
	if code := h.do("POST", "/v1/config/reload", tokAdmin, nil, &res); code != http.StatusOK {
		t.Fatalf("reload: %d", code)
	}
	if !reflect.DeepEqual(res.RestartNeeded, []string{"listen"}) || len(res.Applied) != 0 {
		t.Fatalf("only listen changed; got applied %v, restart needed %v", res.Applied, res.RestartNeeded)
	}
	res = api.ReloadResult{}
	if code := h.do("POST", "/v1/config/reload", tokAdmin, nil, &res); code != http.StatusOK || len(res.RestartNeeded)+len(res.Applied) != 0 {
		t.Fatalf("the same file again: %d, applied %v, restart needed %v", code, res.Applied, res.RestartNeeded)
	}
	// A derived field the operator does write is reported as its own.
	raw, _ := os.ReadFile(file)
	if err := os.WriteFile(file, append(raw, "advertiseURL: http://broker.example:9090\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	res = api.ReloadResult{}
	if code := h.do("POST", "/v1/config/reload", tokAdmin, nil, &res); code != http.StatusOK || !reflect.DeepEqual(res.RestartNeeded, []string{"advertiseURL"}) {
		t.Fatalf("advertiseURL written: %d, applied %v, restart needed %v", code, res.Applied, res.RestartNeeded)
	}
}
