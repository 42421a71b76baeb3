package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"github.com/spillway-dev/spillway/broker/api"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/config"
)

// Config reload (SIGHUP or POST /v1/config/reload; docs/operations.md,
// "Reloading the config"). The file is read and validated whole; then the
// sections an operator tunes while work runs go live at once and the
// others wait for a restart. A file that fails validation, or that would
// strand active jobs (a queue or priority removed while jobs use it),
// changes nothing: the error names the field, goes to the log and to the
// audit log, and the running config stays.

// configSection is one top-level key of the config file.
type configSection struct {
	key string
	get func(*config.Config) any
	// set copies the section from src into dst; nil for the sections that
	// need a restart (the listener, the store, the providers' clients and
	// the ledger's rates are built once at start).
	set func(dst, src *config.Config)
}

// configSections lists every top-level key of config.Config;
// TestReloadCoversEveryConfigKey keeps it complete.
var configSections = []configSection{
	// Live: read on every use, or rebuilt by applyConfigLocked.
	{"auth", func(c *config.Config) any { return c.Auth }, func(d, s *config.Config) { d.Auth = s.Auth }},
	{"scheduler", func(c *config.Config) any { return c.Scheduler }, func(d, s *config.Config) { d.Scheduler = s.Scheduler }},
	{"queues", func(c *config.Config) any { return c.Queues }, func(d, s *config.Config) { d.Queues = s.Queues }},
	{"priorities", func(c *config.Config) any { return c.Priorities }, func(d, s *config.Config) { d.Priorities = s.Priorities }},
	{"teams", func(c *config.Config) any { return c.Teams }, func(d, s *config.Config) { d.Teams = s.Teams }},
	{"agents", func(c *config.Config) any { return c.Agents }, func(d, s *config.Config) { d.Agents = s.Agents }},
	{"telemetry", func(c *config.Config) any { return c.Telemetry }, func(d, s *config.Config) { d.Telemetry = s.Telemetry }},
	{"idle", func(c *config.Config) any { return c.Idle }, func(d, s *config.Config) { d.Idle = s.Idle }},
	// The burst controller's thresholds, waits, in-flight caps, idle TTL,
	// alert webhook and agent settings for new machines; its SSH key is
	// loaded once (burst.sshKeyFile below).
	{"burst", func(c *config.Config) any { b := c.Burst; b.SSHKeyFile = ""; return b }, func(d, s *config.Config) {
		key := d.Burst.SSHKeyFile
		d.Burst = s.Burst
		d.Burst.SSHKeyFile = key
	}},
	{"reports", func(c *config.Config) any { return c.Reports }, func(d, s *config.Config) { d.Reports = s.Reports }},
	{"limits", func(c *config.Config) any { return c.Limits }, func(d, s *config.Config) { d.Limits = s.Limits }},
	{"mounts", func(c *config.Config) any { return c.Mounts }, func(d, s *config.Config) { d.Mounts = s.Mounts }},
	// Restart: set up once at start.
	{"listen", func(c *config.Config) any { return c.Listen }, nil},
	{"advertiseURL", func(c *config.Config) any { return c.AdvertiseURL }, nil},
	{"dataDir", func(c *config.Config) any { return c.DataDir }, nil},
	{"store", func(c *config.Config) any { return c.Store }, nil},
	{"cluster", func(c *config.Config) any { return c.Cluster }, nil},
	{"log", func(c *config.Config) any { return c.Log }, nil},
	{"billing", func(c *config.Config) any { return c.Billing }, nil},
	{"burst.sshKeyFile", func(c *config.Config) any { return c.Burst.SSHKeyFile }, nil},
	{"providers", func(c *config.Config) any { return c.Providers }, nil},
	{"ha", func(c *config.Config) any { return c.HA }, nil},
	{"slurm", func(c *config.Config) any { return c.Slurm }, nil},
	// The certificate itself is read again on every reload; its paths,
	// and turning TLS on or off, need a restart.
	{"tls", func(c *config.Config) any { return c.TLS }, nil},
	{"oidc", func(c *config.Config) any { return c.OIDC }, nil},
}

// reloadState is what a reload compares against.
type reloadState struct {
	mu sync.Mutex // one reload at a time
	// file is the config file, "" when the broker was started without one.
	file string
	// base is the file as last read and as written (config.LoadWritten:
	// no derived defaults, no command-line overrides). A reload compares
	// the new file's written values with it, so an override (--listen)
	// never reads as a change, and a changed field is reported alone, not
	// with the fields whose defaults derive from it (advertiseURL and ha
	// from listen).
	base *config.Config
}

func (s *Server) initReload(file string) {
	s.reload.file = file
	s.reload.base = s.cfg()
	if file == "" {
		return
	}
	if _, w, err := config.LoadWritten(file); err == nil {
		s.reload.base = w
	}
}

// Reload reads the config file again and applies it (SIGHUP, POST
// /v1/config/reload). by names who asked, for the audit log. The TLS
// certificate is read again too. A refused file leaves everything as it
// was and returns the error, which names the field.
func (s *Server) Reload(ctx context.Context, by string) (api.ReloadResult, error) {
	rs := &s.reload
	rs.mu.Lock()
	defer rs.mu.Unlock()
	res := api.ReloadResult{File: rs.file, Applied: []string{}}
	if err := s.ReloadTLS(); err != nil {
		s.log.Error("TLS reload failed; the old certificate stays", "err", err)
	}
	if rs.file == "" {
		return res, newError(http.StatusConflict, "no_config_file", "this broker was started without a config file (spillway dev); there is nothing to reload")
	}
	next, written, err := config.LoadWritten(rs.file)
	if err == nil {
		// The adapters' sections are checked by their adapters.
		_, err = adapters.Parse(next)
	}
	if err == nil {
		s.lock()
		err = s.checkReloadLocked(next)
		s.mu.Unlock()
	}
	if err != nil {
		s.log.Error("config reload refused; the running config stays", "file", rs.file, "by", by, "err", err)
		rec := broker.AuditRecord{At: s.clock.Now(), By: by, Action: "config.reload", Target: rs.file, New: clipText("refused: "+err.Error(), 1000)}
		if aerr := s.store.Batch(ctx, func(tx broker.Tx) error { return broker.Audit(tx, rec) }); aerr != nil {
			s.log.Warn("audit the refused reload", "err", aerr)
		}
		if _, ok := broker.AsValidation(err); ok {
			return res, err
		}
		return res, newError(http.StatusBadRequest, "invalid_config", "%s", err.Error())
	}
	cur := s.cfg()
	merged := *cur
	for _, sec := range configSections {
		if sameJSON(sec.get(written), sec.get(rs.base)) {
			continue
		}
		if sec.set == nil {
			res.RestartNeeded = append(res.RestartNeeded, sec.key)
			continue
		}
		sec.set(&merged, next)
		res.Applied = append(res.Applied, sec.key)
	}
	// merged mixes next's live sections with cur's restart ones, both
	// checked: decoding it cannot fail.
	sections, err := adapters.Parse(&merged)
	if err != nil {
		return res, fmt.Errorf("reload: the merged config's adapter sections: %w", err)
	}
	// The sections' values as of this file, so a second reload of the
	// same file reports nothing new.
	rs.base = written
	rec := broker.AuditRecord{At: s.clock.Now(), By: by, Action: "config.reload", Target: rs.file,
		Old: "", New: reloadSummary(res)}
	s.lock()
	err = s.store.Batch(ctx, func(tx broker.Tx) error { return broker.Audit(tx, rec) })
	if err == nil {
		s.applyConfigLocked(&merged, sections)
	}
	s.mu.Unlock()
	if err != nil {
		return res, fmt.Errorf("audit the reload: %w", err)
	}
	s.log.Info("config reloaded", "file", rs.file, "by", by, "applied", strings.Join(res.Applied, ","),
		"restart_needed", strings.Join(res.RestartNeeded, ","))
	return res, nil
}

// checkReloadLocked refuses a config that would strand active jobs: every
// queue and priority an active job names must still be there.
func (s *Server) checkReloadLocked(next *config.Config) error {
	ve := &broker.ValidationError{}
	queues := map[string]bool{}
	for _, q := range next.Queues {
		queues[q.Name] = true
	}
	prios := map[string]bool{}
	for _, p := range next.Priorities {
		prios[p.Name] = true
	}
	inQueue, inPrio := map[string]int{}, map[string]int{}
	for j := range s.view.Jobs() {
		if !queues[j.Spec.Queue] {
			inQueue[j.Spec.Queue]++
		}
		if !prios[j.Spec.Priority] {
			inPrio[j.Spec.Priority]++
		}
	}
	for _, q := range slices.Sorted(maps.Keys(inQueue)) {
		ve.Errors = append(ve.Errors, broker.FieldError{Field: "queues", Code: broker.CodeInvalid,
			Message: fmt.Sprintf("queue %s is gone from the file but %d active job(s) are in it; keep it until they end (spillway jobs --queue %s)", q, inQueue[q], q)})
	}
	for _, p := range slices.Sorted(maps.Keys(inPrio)) {
		ve.Errors = append(ve.Errors, broker.FieldError{Field: "priorities", Code: broker.CodeInvalid,
			Message: fmt.Sprintf("priority %s is gone from the file but %d active job(s) have it; keep it until they end", p, inPrio[p])})
	}
	if len(ve.Errors) > 0 {
		return ve
	}
	return nil
}

// applyConfigLocked makes c the config in force and rebuilds what the
// server derived from the old one. Everything else reads s.cfg() on use.
func (s *Server) applyConfigLocked(c *config.Config, sections *adapters.Config) {
	s.conf.Store(c)
	s.sections.Store(sections)
	s.reloadTokens(c.Auth.Tokens)
	if sc := &s.scheduling; sc.ledger != nil {
		sc.policy = c.Policy()
		sc.ledger.HalfLife = c.Scheduler.FairShareHalfLife.D()
	}
	s.kick()
}

// reloadConfig serves POST /v1/config/reload (operators).
func (s *Server) reloadConfig(c echo.Context) error {
	res, err := s.Reload(c.Request().Context(), principal(c).Name)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func reloadSummary(r api.ReloadResult) string {
	out := "applied: " + cmp.Or(strings.Join(r.Applied, ", "), "nothing changed")
	if len(r.RestartNeeded) > 0 {
		out += "; restart needed: " + strings.Join(r.RestartNeeded, ", ")
	}
	return out
}

func sameJSON(a, b any) bool {
	ra, ea := json.Marshal(a)
	rb, eb := json.Marshal(b)
	return ea == nil && eb == nil && string(ra) == string(rb)
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
