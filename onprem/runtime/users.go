package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ident is the host uid and gid an attempt runs as.
type ident struct {
	UID, GID uint32
}

// userMap turns a job's team and user into a host uid: the config's
// table first, then a uid handed out once from the range and kept in the
// data dir, so a team keeps its uid across agent restarts and its files
// stay its own.
type userMap struct {
	table   map[string]ident
	perUser bool
	first   uint32
	last    uint32
	file    string

	mu    sync.Mutex
	given map[string]uint32
}

func parseIdent(s string) (ident, error) {
	u, g, hasG := strings.Cut(s, ":")
	uid, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		return ident{}, fmt.Errorf("%q: want uid or uid:gid", s)
	}
	gid := uid
	if hasG {
		if gid, err = strconv.ParseUint(g, 10, 32); err != nil {
			return ident{}, fmt.Errorf("%q: want uid or uid:gid", s)
		}
	}
	if uid == 0 || gid == 0 {
		return ident{}, fmt.Errorf("%q: jobs never run as root (uid or gid 0)", s)
	}
	return ident{UID: uint32(uid), GID: uint32(gid)}, nil
}

func newUserMap(cfg Config, dataDir string) (*userMap, error) {
	m := &userMap{table: map[string]ident{}, perUser: cfg.PerUser, first: 20000, last: 29999,
		file: filepath.Join(dataDir, "uids.json"), given: map[string]uint32{}}
	for k, v := range cfg.Users {
		id, err := parseIdent(v)
		if err != nil {
			return nil, fmt.Errorf("runtime.users.%s: %w", k, err)
		}
		m.table[k] = id
	}
	if cfg.UIDRange != "" {
		a, b, ok := strings.Cut(cfg.UIDRange, "-")
		lo, err1 := strconv.ParseUint(a, 10, 32)
		hi, err2 := strconv.ParseUint(b, 10, 32)
		if !ok || err1 != nil || err2 != nil || lo == 0 || hi < lo {
			return nil, fmt.Errorf("runtime.uidRange: want first-last with 0 < first <= last, got %q", cfg.UIDRange)
		}
		m.first, m.last = uint32(lo), uint32(hi)
	}
	if raw, err := os.ReadFile(m.file); err == nil {
		if err := json.Unmarshal(raw, &m.given); err != nil {
			return nil, fmt.Errorf("read %s: %w", m.file, err)
		}
	}
	return m, nil
}

// lookup returns the uid for a job of team (and user).
func (m *userMap) lookup(team, user string) (ident, error) {
	if team == "" {
		team = "default"
	}
	if user != "" {
		if id, ok := m.table[team+"/"+user]; ok {
			return id, nil
		}
	}
	key := team
	if m.perUser && user != "" {
		key = team + "/" + user
	}
	if id, ok := m.table[key]; ok {
		return id, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if uid, ok := m.given[key]; ok {
		return ident{UID: uid, GID: uid}, nil
	}
	used := map[uint32]bool{}
	for _, id := range m.table {
		used[id.UID] = true
	}
	for _, uid := range m.given {
		used[uid] = true
	}
	for uid := m.first; uid <= m.last && uid >= m.first; uid++ {
		if used[uid] {
			continue
		}
		m.given[key] = uid
		if err := m.save(); err != nil {
			delete(m.given, key)
			return ident{}, err
		}
		return ident{UID: uid, GID: uid}, nil
	}
	return ident{}, fmt.Errorf("runtime.uidRange %d-%d is used up", m.first, m.last)
}

func (m *userMap) save() error {
	raw, err := json.MarshalIndent(m.given, "", "  ")
	if err != nil {
		return err
	}
	tmp := m.file + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("save uids: %w", err)
	}
	return os.Rename(tmp, m.file)
}

// keys lists the teams and users with a uid, for the probe.
func (m *userMap) keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.table {
		out = append(out, k)
	}
	for k := range m.given {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
