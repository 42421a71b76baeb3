package fakecloud

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// LambdaOptions configures a fake Lambda Cloud API.
type LambdaOptions struct {
	// APIKey is the only key accepted; default "fake-lambda-key".
	APIKey string
	// SSHD boots a real sshd for every instance at its IP and SSHPort(),
	// with the host key from the user data's ssh_keys when it has one.
	SSHD bool
	// Types are the instance types on offer; default one 1xH100 and one
	// 8xH100 type in us-east-1.
	Types []LambdaType
	// BootTime is how long an instance stays booting; TerminateTime how
	// long it stays terminating before it is gone.
	BootTime, TerminateTime time.Duration
}

// LambdaType is an instance type of the fake, with its capacity.
type LambdaType struct {
	Name           string
	GPUDescription string // "H100 (80 GB SXM5)"
	PriceCents     int64
	GPUs, VCPUs    int
	MemoryGiB      int
	// Regions with capacity, and how many live instances each allows.
	Capacity map[string]int
}

// Lambda is a fake of the Lambda Cloud API v1.
type Lambda struct {
	// URL is the base URL (the API lives under /api/v1).
	URL string

	opts  LambdaOptions
	fleet *fleet
	srv   *httptest.Server

	mu        sync.Mutex
	instances map[string]*lambdaInstance
	order     []string
	keys      []lambdaKey
	failNext  map[string]lambdaFailure
	calls     map[string]int
	seq       int
}

type lambdaKey struct{ ID, Name, PublicKey string }

type lambdaFailure struct {
	status int
	code   string
}

type lambdaInstance struct {
	id, name, region, typ string
	tags                  map[string]string
	sshKeyNames           []string
	userData              string
	launched, terminated  time.Time
	m                     *machine
}

// StartLambda starts a fake Lambda Cloud API on 127.0.0.1. Close ends it
// and its machines.
func StartLambda(opts LambdaOptions) (*Lambda, error) {
	if opts.APIKey == "" {
		opts.APIKey = "fake-lambda-key"
	}
	if opts.Types == nil {
		opts.Types = []LambdaType{
			{Name: "gpu_1x_h100_pcie", GPUDescription: "H100 (80 GB PCIe)", PriceCents: 249, GPUs: 1, VCPUs: 26, MemoryGiB: 200,
				Capacity: map[string]int{"us-east-1": 100}},
			{Name: "gpu_8x_h100_sxm5", GPUDescription: "H100 (80 GB SXM5)", PriceCents: 2392, GPUs: 8, VCPUs: 208, MemoryGiB: 1800,
				Capacity: map[string]int{"us-east-1": 100, "us-west-1": 100}},
		}
	}
	fl, err := newFleet(opts.SSHD, nil)
	if err != nil {
		return nil, err
	}
	l := &Lambda{
		opts: opts, fleet: fl,
		instances: map[string]*lambdaInstance{}, failNext: map[string]lambdaFailure{}, calls: map[string]int{},
	}
	l.srv = httptest.NewServer(http.HandlerFunc(l.serve))
	l.URL = l.srv.URL
	return l, nil
}

// Close ends the endpoint, then every machine.
func (l *Lambda) Close() {
	l.srv.Close()
	l.fleet.stopAll()
}

// APIKey is the key the fake accepts.
func (l *Lambda) APIKey() string { return l.opts.APIKey }

// SSHPort is the port every instance's sshd listens on.
func (l *Lambda) SSHPort() int { return l.fleet.port }

// FailNext makes the next call to "METHOD /path-prefix" (e.g.
// "POST /instance-operations/launch") fail with status and error code.
func (l *Lambda) FailNext(route string, status int, code string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failNext[route] = lambdaFailure{status: status, code: code}
}

// SetCapacity sets how many live instances of a type a region allows.
func (l *Lambda) SetCapacity(typeName, region string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.opts.Types {
		if l.opts.Types[i].Name == typeName {
			if l.opts.Types[i].Capacity == nil {
				l.opts.Types[i].Capacity = map[string]int{}
			}
			l.opts.Types[i].Capacity[region] = n
		}
	}
}

// Calls returns how many times "METHOD /route" was called.
func (l *Lambda) Calls(route string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[route]
}

// LambdaInstance is a snapshot of a fake instance.
type LambdaInstance struct {
	ID, Name, Region, Type, Status, UserData string
	Tags                                     map[string]string
	SSHKeyNames                              []string
	IP                                       string
	HostKey                                  ssh.PublicKey
	SSHD                                     *SSHHost
}

// Instances returns the instances not yet gone, in launch order.
func (l *Lambda) Instances() []LambdaInstance {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reap()
	var out []LambdaInstance
	for _, id := range l.order {
		in, ok := l.instances[id]
		if !ok {
			continue
		}
		out = append(out, LambdaInstance{
			ID: in.id, Name: in.name, Region: in.region, Type: in.typ, Status: l.status(in), UserData: in.userData,
			Tags: maps.Clone(in.tags), SSHKeyNames: in.sshKeyNames, IP: in.m.ip, HostKey: in.m.hostKey, SSHD: in.m.sshd,
		})
	}
	return out
}

// SSHKeys returns the registered keys as name → public key.
func (l *Lambda) SSHKeys() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]string{}
	for _, k := range l.keys {
		out[k.Name] = k.PublicKey
	}
	return out
}

func (l *Lambda) status(in *lambdaInstance) string {
	switch {
	case !in.terminated.IsZero():
		return "terminating"
	case time.Since(in.launched) < l.opts.BootTime:
		return "booting"
	default:
		return "active"
	}
}

func (l *Lambda) reap() {
	for id, in := range l.instances {
		if !in.terminated.IsZero() && time.Since(in.terminated) >= l.opts.TerminateTime {
			delete(l.instances, id)
		}
	}
}

func writeLambda(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeLambdaError(w http.ResponseWriter, status int, code, msg string) {
	writeLambda(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (l *Lambda) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+l.opts.APIKey {
		writeLambdaError(w, http.StatusUnauthorized, "global/invalid-api-key", "API key was invalid, expired, or deleted.")
		return
	}
	p, ok := strings.CutPrefix(r.URL.Path, "/api/v1")
	if !ok {
		writeLambdaError(w, http.StatusNotFound, "global/object-does-not-exist", "no such route")
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reap()
	route := r.Method + " " + p
	if strings.HasPrefix(p, "/instances/") {
		route = r.Method + " /instances/{id}"
	}
	l.calls[route]++
	if f, ok := l.failNext[route]; ok {
		delete(l.failNext, route)
		writeLambdaError(w, f.status, f.code, "injected failure")
		return
	}
	switch route {
	case "GET /instance-types":
		l.instanceTypes(w)
	case "POST /instance-operations/launch":
		l.launch(w, r)
	case "POST /instance-operations/terminate":
		l.terminate(w, r)
	case "GET /instances":
		var data []map[string]any
		for _, id := range l.order {
			if in, ok := l.instances[id]; ok {
				data = append(data, l.view(in))
			}
		}
		writeLambda(w, http.StatusOK, map[string]any{"data": data})
	case "GET /instances/{id}":
		in, ok := l.instances[strings.TrimPrefix(p, "/instances/")]
		if !ok {
			writeLambdaError(w, http.StatusNotFound, "global/object-does-not-exist", "Specified instance does not exist.")
			return
		}
		writeLambda(w, http.StatusOK, map[string]any{"data": l.view(in)})
	case "GET /ssh-keys":
		data := []map[string]string{}
		for _, k := range l.keys {
			data = append(data, map[string]string{"id": k.ID, "name": k.Name, "public_key": k.PublicKey})
		}
		writeLambda(w, http.StatusOK, map[string]any{"data": data})
	case "POST /ssh-keys":
		l.addKey(w, r)
	default:
		writeLambdaError(w, http.StatusNotFound, "global/object-does-not-exist", "no such route "+route)
	}
}

func (l *Lambda) typeByName(name string) (LambdaType, bool) {
	for _, t := range l.opts.Types {
		if t.Name == name {
			return t, true
		}
	}
	return LambdaType{}, false
}

func typeJSON(t LambdaType) map[string]any {
	return map[string]any{
		"name": t.Name, "description": fmt.Sprintf("%dx %s", t.GPUs, t.GPUDescription), "gpu_description": t.GPUDescription,
		"price_cents_per_hour": t.PriceCents,
		"specs":                map[string]int{"vcpus": t.VCPUs, "memory_gib": t.MemoryGiB, "storage_gib": 1024, "gpus": t.GPUs},
	}
}

func (l *Lambda) live(typ, region string) int {
	n := 0
	for _, in := range l.instances {
		if in.typ == typ && in.region == region && in.terminated.IsZero() {
			n++
		}
	}
	return n
}

func (l *Lambda) instanceTypes(w http.ResponseWriter) {
	data := map[string]any{}
	for _, t := range l.opts.Types {
		regions := []map[string]string{}
		for _, r := range slices.Sorted(maps.Keys(t.Capacity)) {
			if l.live(t.Name, r) < t.Capacity[r] {
				regions = append(regions, map[string]string{"name": r, "description": "fake region " + r})
			}
		}
		data[t.Name] = map[string]any{"instance_type": typeJSON(t), "regions_with_capacity_available": regions}
	}
	writeLambda(w, http.StatusOK, map[string]any{"data": data})
}

type lambdaLaunch struct {
	RegionName       string   `json:"region_name"`
	InstanceTypeName string   `json:"instance_type_name"`
	SSHKeyNames      []string `json:"ssh_key_names"`
	Name             string   `json:"name"`
	UserData         string   `json:"user_data"`
	Tags             []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"tags"`
}

func (l *Lambda) launch(w http.ResponseWriter, r *http.Request) {
	var req lambdaLaunch
	dec := json.NewDecoder(io.LimitReader(r.Body, 2<<20))
	if err := dec.Decode(&req); err != nil {
		writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", "Invalid request data: "+err.Error())
		return
	}
	if req.RegionName == "" || req.InstanceTypeName == "" || len(req.SSHKeyNames) != 1 || len(req.Name) > 64 || len(req.UserData) > 1<<20 {
		writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", "region_name, instance_type_name and exactly one ssh key name are required")
		return
	}
	t, ok := l.typeByName(req.InstanceTypeName)
	if !ok {
		writeLambdaError(w, http.StatusNotFound, "global/object-does-not-exist", "Instance type "+req.InstanceTypeName+" does not exist.")
		return
	}
	var key *lambdaKey
	for i := range l.keys {
		if l.keys[i].Name == req.SSHKeyNames[0] {
			key = &l.keys[i]
		}
	}
	if key == nil {
		writeLambdaError(w, http.StatusNotFound, "global/object-does-not-exist", "SSH key "+req.SSHKeyNames[0]+" does not exist.")
		return
	}
	if l.live(t.Name, req.RegionName) >= t.Capacity[req.RegionName] {
		writeLambdaError(w, http.StatusBadRequest, "instance-operations/launch/insufficient-capacity", "Not enough capacity to fulfill launch request.")
		return
	}
	tags := map[string]string{}
	for _, tg := range req.Tags {
		if len(tg.Key) > 55 || len(tg.Value) > 128 {
			writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", "tag too long")
			return
		}
		tags[tg.Key] = tg.Value
	}
	ci, err := ParseUserData(req.UserData)
	if err != nil {
		writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", err.Error())
		return
	}
	ci.AuthorizedKeys = append(ci.AuthorizedKeys, key.PublicKey)
	m, err := l.fleet.boot(ci)
	if err != nil {
		writeLambdaError(w, http.StatusInternalServerError, "provider/internal-unavailable", err.Error())
		return
	}
	l.seq++
	in := &lambdaInstance{
		id: fmt.Sprintf("%032x", 0xfa4e0000+l.seq), name: req.Name, region: req.RegionName, typ: t.Name,
		tags: tags, sshKeyNames: req.SSHKeyNames, userData: req.UserData, launched: time.Now(), m: m,
	}
	l.instances[in.id] = in
	l.order = append(l.order, in.id)
	writeLambda(w, http.StatusOK, map[string]any{"data": map[string]any{"instance_ids": []string{in.id}}})
}

func (l *Lambda) terminate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		InstanceIDs []string `json:"instance_ids"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.InstanceIDs) == 0 {
		writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", "instance_ids required")
		return
	}
	var done []map[string]any
	for _, id := range req.InstanceIDs {
		in, ok := l.instances[id]
		if !ok {
			writeLambdaError(w, http.StatusNotFound, "global/object-does-not-exist", "Specified instance does not exist.")
			return
		}
		if in.terminated.IsZero() {
			in.terminated = time.Now()
			in.m.stop()
		}
		done = append(done, l.view(in))
	}
	writeLambda(w, http.StatusOK, map[string]any{"data": map[string]any{"terminated_instances": done}})
}

func (l *Lambda) addKey(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name      string `json:"name"`
		PublicKey string `json:"public_key"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Name == "" || req.PublicKey == "" {
		writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", "name and public_key required")
		return
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(req.PublicKey)); err != nil {
		writeLambdaError(w, http.StatusBadRequest, "global/invalid-parameters", "invalid public key")
		return
	}
	for _, k := range l.keys {
		if k.Name == req.Name {
			writeLambdaError(w, http.StatusBadRequest, "global/duplicate", "SSH key name already in use")
			return
		}
	}
	l.seq++
	k := lambdaKey{ID: fmt.Sprintf("%032x", 0x5e4000+l.seq), Name: req.Name, PublicKey: req.PublicKey}
	l.keys = append(l.keys, k)
	writeLambda(w, http.StatusOK, map[string]any{"data": map[string]string{"id": k.ID, "name": k.Name, "public_key": k.PublicKey}})
}

// view is the instance as the API shows it.
func (l *Lambda) view(in *lambdaInstance) map[string]any {
	t, _ := l.typeByName(in.typ)
	tags := []map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(in.tags)) {
		tags = append(tags, map[string]string{"key": k, "value": in.tags[k]})
	}
	return map[string]any{
		"id": in.id, "name": in.name, "ip": in.m.ip, "private_ip": in.m.ip, "status": l.status(in),
		"ssh_key_names": in.sshKeyNames, "file_system_names": []string{},
		"region":        map[string]string{"name": in.region, "description": "fake region " + in.region},
		"instance_type": typeJSON(t), "hostname": in.m.ip, "tags": tags,
		"actions": map[string]any{
			"migrate": map[string]bool{"available": false}, "rebuild": map[string]bool{"available": false},
			"restart": map[string]bool{"available": true}, "cold_reboot": map[string]bool{"available": false},
			"terminate": map[string]bool{"available": in.terminated.IsZero()},
		},
	}
}
