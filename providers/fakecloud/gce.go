package fakecloud

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"golang.org/x/crypto/ssh"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// GCEOptions configures a fake Compute Engine endpoint.
type GCEOptions struct {
	// Project is the only project the fake serves; default "spillway-test".
	Project string
	// SSHD boots a real sshd for every instance, reachable at its NAT IP
	// (or internal IP) and SSHPort(). Keys in the ssh-keys metadata may
	// log in.
	SSHD bool
	// Capacity caps live instances of a machine type; the insert
	// operation then ends in ZONE_RESOURCE_POOL_EXHAUSTED.
	Capacity map[string]int
	// BootTime is how long an instance stays STAGING, without guest
	// attributes; DeleteTime how long it stays STOPPING after a delete.
	BootTime, DeleteTime time.Duration
}

// GCE is a fake Compute Engine REST API (JSON, as the apiv1 REST clients
// speak it) for instances.insert/get/list/delete/getGuestAttributes and
// zoneOperations.get/wait.
type GCE struct {
	// URL is the endpoint to give the client (option.WithEndpoint).
	URL string

	opts  GCEOptions
	fleet *fleet
	srv   *httptest.Server

	mu        sync.Mutex
	instances map[string]*gceInstance // zone/name
	order     []string
	ops       map[string]*computepb.Operation // name → operation
	requests  map[string]string               // requestId → operation name
	failNext  map[string]gceFailure
	failNthOp nthFailure
	policies  map[string]*computepb.ResourcePolicy // region/name
	calls     map[string]int
	seq       int
}

type gceFailure struct {
	status int
	reason string
	opCode string
}

type gceInstance struct {
	res       *computepb.Instance
	zone      string
	created   time.Time
	deleted   time.Time
	m         *machine
	attrKey   ssh.PublicKey // overrides the published key when set
	requestID string
	policies  []string // resource policies, region/name
}

// StartGCE starts a fake Compute Engine endpoint on 127.0.0.1. Close ends
// it and its machines.
func StartGCE(opts GCEOptions) (*GCE, error) {
	if opts.Project == "" {
		opts.Project = "spillway-test"
	}
	fl, err := newFleet(opts.SSHD, nil)
	if err != nil {
		return nil, err
	}
	g := &GCE{
		opts: opts, fleet: fl,
		instances: map[string]*gceInstance{}, ops: map[string]*computepb.Operation{},
		requests: map[string]string{}, failNext: map[string]gceFailure{}, calls: map[string]int{},
	}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	g.URL = g.srv.URL
	return g, nil
}

// Close ends the endpoint, then every machine.
func (g *GCE) Close() {
	g.srv.Close()
	g.fleet.stopAll()
}

// SSHPort is the port every instance's sshd listens on.
func (g *GCE) SSHPort() int { return g.fleet.port }

// Project is the project the fake serves.
func (g *GCE) Project() string { return g.opts.Project }

// FailNext makes the next call of method ("insert", "get", "list",
// "delete", "getGuestAttributes") fail synchronously with an HTTP status
// and error reason ("quotaExceeded", "forbidden").
func (g *GCE) FailNext(method string, status int, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failNext[method] = gceFailure{status: status, reason: reason}
}

// FailNextOperation makes the next insert's operation end with an error
// code ("QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED").
func (g *GCE) FailNextOperation(code string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failNext["operation"] = gceFailure{opCode: code}
}

// Calls returns how many times method was called.
func (g *GCE) Calls(method string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[method]
}

// GCEInstance is a snapshot of a fake instance.
type GCEInstance struct {
	Zone, Name, Status, RequestID string
	Resource                      *computepb.Instance
	IP                            string
	HostKey                       ssh.PublicKey
	SSHD                          *SSHHost
}

// Instances returns every live instance in insert order.
func (g *GCE) Instances() []GCEInstance {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []GCEInstance
	for _, id := range g.order {
		in, ok := g.instances[id]
		if !ok {
			continue
		}
		out = append(out, GCEInstance{
			Zone: in.zone, Name: in.res.GetName(), Status: g.status(in), RequestID: in.requestID,
			Resource: in.res, IP: in.m.ip, HostKey: in.m.hostKey, SSHD: in.m.sshd,
		})
	}
	return out
}

// PublishHostKey makes the guest attributes of zone/name show key instead
// of the machine's real host key.
func (g *GCE) PublishHostKey(id string, key ssh.PublicKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if in, ok := g.instances[id]; ok {
		in.attrKey = key
	}
}

func (g *GCE) status(in *gceInstance) string {
	now := time.Now()
	switch {
	case !in.deleted.IsZero():
		return "STOPPING"
	case now.Sub(in.created) < g.opts.BootTime:
		return "STAGING"
	default:
		return "RUNNING"
	}
}

// reap forgets instances whose deletion has finished.
func (g *GCE) reap() {
	for id, in := range g.instances {
		if !in.deleted.IsZero() && time.Since(in.deleted) >= g.opts.DeleteTime {
			delete(g.instances, id)
		}
	}
}

var (
	instancesPath  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+)(/getGuestAttributes)?)?$`)
	operationsPath = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+?)(/wait)?$`)
	labelFilter    = regexp.MustCompile(`labels\.([a-z0-9_-]+)\s*=\s*"?([a-z0-9_-]*)"?`)
)

func writeGoogleError(w http.ResponseWriter, status int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": status, "message": msg,
		"errors": []map[string]string{{"message": msg, "domain": "global", "reason": reason}},
	}})
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		writeGoogleError(w, http.StatusInternalServerError, "backendError", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(b)
}

func (g *GCE) serve(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reap()
	if g.serveRegion(w, r) {
		return
	}
	if m := operationsPath.FindStringSubmatch(r.URL.Path); m != nil {
		g.calls["operations"]++
		op, ok := g.ops[m[3]]
		if !ok || m[1] != g.opts.Project {
			writeGoogleError(w, http.StatusNotFound, "notFound", "The resource 'operations/"+m[3]+"' was not found")
			return
		}
		writeProto(w, op)
		return
	}
	m := instancesPath.FindStringSubmatch(r.URL.Path)
	if m == nil || m[1] != g.opts.Project {
		writeGoogleError(w, http.StatusNotFound, "notFound", "no such resource "+r.URL.Path)
		return
	}
	zone, name := m[2], m[3]
	var method string
	switch {
	case m[4] != "":
		method = "getGuestAttributes"
	case name == "" && r.Method == http.MethodPost:
		method = "insert"
	case name == "" && r.Method == http.MethodGet:
		method = "list"
	case r.Method == http.MethodGet:
		method = "get"
	case r.Method == http.MethodDelete:
		method = "delete"
	default:
		writeGoogleError(w, http.StatusMethodNotAllowed, "badRequest", "unsupported method")
		return
	}
	g.calls[method]++
	if f, ok := g.failNext[method]; ok {
		delete(g.failNext, method)
		writeGoogleError(w, f.status, f.reason, "injected failure")
		return
	}
	switch method {
	case "insert":
		g.insert(w, r, zone)
	case "list":
		g.list(w, r, zone)
	case "get":
		in, ok := g.instances[zone+"/"+name]
		if !ok {
			writeGoogleError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", g.opts.Project, zone, name))
			return
		}
		writeProto(w, g.view(in))
	case "delete":
		g.delete(w, zone, name)
	case "getGuestAttributes":
		g.guestAttributes(w, r, zone, name)
	}
}

func (g *GCE) newOp(kind, zone, target string) *computepb.Operation {
	g.seq++
	op := &computepb.Operation{
		Kind: ptrTo("compute#operation"), Id: ptrTo(uint64(1000 + g.seq)), Name: ptrTo(fmt.Sprintf("operation-%d-%s", g.seq, kind)),
		Zone: ptrTo(g.link("zones/" + zone)), OperationType: ptrTo(kind), TargetLink: ptrTo(target),
		Status: computepb.Operation_RUNNING.Enum(), Progress: ptrTo(int32(0)),
		InsertTime: ptrTo(time.Now().UTC().Format(time.RFC3339)),
	}
	op.SelfLink = ptrTo(g.link("zones/" + zone + "/operations/" + op.GetName()))
	g.ops[op.GetName()] = op
	return op
}

// running is how an insert answers: the operation as it was before it
// finished. The stored one is done; the client sees that on its first
// zoneOperations.wait.
func running(op *computepb.Operation) *computepb.Operation {
	r := proto.Clone(op).(*computepb.Operation)
	r.Status = computepb.Operation_RUNNING.Enum()
	r.Progress = ptrTo(int32(0))
	r.Error, r.HttpErrorStatusCode, r.HttpErrorMessage = nil, nil, nil
	return r
}

// finish marks an operation done, with an error code when code is set.
func finish(op *computepb.Operation, code string, status int32, msg string) {
	op.Status = computepb.Operation_DONE.Enum()
	op.Progress = ptrTo(int32(100))
	if code != "" {
		op.Error = &computepb.Error{Errors: []*computepb.Errors{{Code: ptrTo(code), Message: ptrTo(msg)}}}
		op.HttpErrorStatusCode = ptrTo(status)
		op.HttpErrorMessage = ptrTo(http.StatusText(int(status)))
	}
}

func (g *GCE) link(rel string) string {
	return g.URL + "/compute/v1/projects/" + g.opts.Project + "/" + rel
}

func (g *GCE) insert(w http.ResponseWriter, r *http.Request, zone string) {
	reqID := r.URL.Query().Get("requestId")
	if opName, ok := g.requests[reqID]; ok && reqID != "" {
		// Same request id: the same operation, nothing done twice.
		writeProto(w, g.ops[opName])
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeGoogleError(w, http.StatusBadRequest, "badRequest", err.Error())
		return
	}
	res := &computepb.Instance{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, res); err != nil {
		writeGoogleError(w, http.StatusBadRequest, "invalid", "Invalid JSON payload received: "+err.Error())
		return
	}
	name := res.GetName()
	if name == "" || res.GetMachineType() == "" || len(res.GetDisks()) == 0 {
		writeGoogleError(w, http.StatusBadRequest, "invalid", "name, machineType and a boot disk are required")
		return
	}
	policies, status, reason, msg := g.checkPolicies(res, zone)
	if status != 0 {
		writeGoogleError(w, status, reason, msg)
		return
	}
	if _, ok := g.instances[zone+"/"+name]; ok {
		writeGoogleError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", g.opts.Project, zone, name))
		return
	}
	target := g.link("zones/" + zone + "/instances/" + name)
	op := g.newOp("insert", zone, target)
	if reqID != "" {
		g.requests[reqID] = op.GetName()
	}
	mt := path.Base(res.GetMachineType())
	if code, ok := g.nthOperationFailure(); ok {
		status := int32(http.StatusForbidden)
		if strings.Contains(code, "EXHAUSTED") {
			status = http.StatusServiceUnavailable
		}
		finish(op, code, status, "injected failure of this insert: "+code)
		writeProto(w, running(op))
		return
	}
	if f, ok := g.failNext["operation"]; ok {
		delete(g.failNext, "operation")
		status := int32(http.StatusForbidden)
		if strings.Contains(f.opCode, "EXHAUSTED") {
			status = http.StatusServiceUnavailable
		}
		finish(op, f.opCode, status, "injected operation failure")
		writeProto(w, running(op))
		return
	}
	if c, ok := g.opts.Capacity[mt]; ok && g.live(mt) >= c {
		finish(op, "ZONE_RESOURCE_POOL_EXHAUSTED", http.StatusServiceUnavailable,
			"The zone '"+zone+"' does not have enough resources available to fulfill the request.")
		writeProto(w, running(op))
		return
	}
	var ci CloudInit
	for _, item := range res.GetMetadata().GetItems() {
		if item.GetKey() != "ssh-keys" {
			continue
		}
		// "user:ssh-ed25519 AAAA… comment", one a line.
		for _, line := range strings.Split(item.GetValue(), "\n") {
			if _, key, ok := strings.Cut(line, ":"); ok {
				ci.AuthorizedKeys = append(ci.AuthorizedKeys, key)
			}
		}
	}
	mach, err := g.fleet.boot(ci)
	if err != nil {
		finish(op, "INTERNAL_ERROR", http.StatusInternalServerError, err.Error())
		writeProto(w, running(op))
		return
	}
	g.seq++
	res.Id = ptrTo(uint64(7000000000 + g.seq))
	res.Kind = ptrTo("compute#instance")
	res.Zone = ptrTo(g.link("zones/" + zone))
	res.SelfLink = ptrTo(target)
	res.MachineType = ptrTo(g.link("zones/" + zone + "/machineTypes/" + mt))
	res.CreationTimestamp = ptrTo(time.Now().UTC().Format(time.RFC3339))
	for _, nic := range res.GetNetworkInterfaces() {
		nic.NetworkIP = ptrTo(mach.ip)
		for _, ac := range nic.GetAccessConfigs() {
			ac.NatIP = ptrTo(mach.ip)
		}
	}
	g.instances[zone+"/"+name] = &gceInstance{res: res, zone: zone, created: time.Now(), m: mach, requestID: reqID, policies: policies}
	g.order = append(g.order, zone+"/"+name)
	finish(op, "", 0, "")
	writeProto(w, running(op))
}

func (g *GCE) live(machineType string) int {
	n := 0
	for _, in := range g.instances {
		if path.Base(in.res.GetMachineType()) == machineType && in.deleted.IsZero() {
			n++
		}
	}
	return n
}

// view is the instance as the API shows it now.
func (g *GCE) view(in *gceInstance) *computepb.Instance {
	res := cloneInstance(in.res)
	res.Status = ptrTo(g.status(in))
	return res
}

func cloneInstance(in *computepb.Instance) *computepb.Instance {
	return proto.Clone(in).(*computepb.Instance)
}

func (g *GCE) list(w http.ResponseWriter, r *http.Request, zone string) {
	want := map[string]string{}
	for _, m := range labelFilter.FindAllStringSubmatch(r.URL.Query().Get("filter"), -1) {
		want[m[1]] = m[2]
	}
	list := &computepb.InstanceList{Kind: ptrTo("compute#instanceList"), Id: ptrTo("projects/" + g.opts.Project + "/zones/" + zone + "/instances")}
	for _, id := range slices.Sorted(maps.Keys(g.instances)) {
		in := g.instances[id]
		if in.zone != zone {
			continue
		}
		match := true
		for k, v := range want {
			if in.res.GetLabels()[k] != v {
				match = false
			}
		}
		if match {
			list.Items = append(list.Items, g.view(in))
		}
	}
	writeProto(w, list)
}

func (g *GCE) delete(w http.ResponseWriter, zone, name string) {
	in, ok := g.instances[zone+"/"+name]
	if !ok {
		writeGoogleError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", g.opts.Project, zone, name))
		return
	}
	op := g.newOp("delete", zone, g.link("zones/"+zone+"/instances/"+name))
	if in.deleted.IsZero() {
		in.deleted = time.Now()
		in.m.stop()
	}
	finish(op, "", 0, "")
	writeProto(w, op)
}

func (g *GCE) guestAttributes(w http.ResponseWriter, r *http.Request, zone, name string) {
	in, ok := g.instances[zone+"/"+name]
	if !ok {
		writeGoogleError(w, http.StatusNotFound, "notFound", "The resource 'instances/"+name+"' was not found")
		return
	}
	q := r.URL.Query().Get("queryPath")
	enabled := false
	for _, item := range in.res.GetMetadata().GetItems() {
		if item.GetKey() == "enable-guest-attributes" && strings.EqualFold(item.GetValue(), "true") {
			enabled = true
		}
	}
	// The guest agent publishes host keys once the machine runs, and only
	// where guest attributes are enabled.
	if !enabled || g.status(in) != "RUNNING" || q != "hostkeys/" {
		writeGoogleError(w, http.StatusNotFound, "notFound", "The resource 'guestAttributes/"+q+"' was not found")
		return
	}
	key := in.m.hostKey
	if in.attrKey != nil {
		key = in.attrKey
	}
	fields := strings.Fields(string(ssh.MarshalAuthorizedKey(key)))
	writeProto(w, &computepb.GuestAttributes{
		Kind: ptrTo("compute#guestAttributes"), QueryPath: ptrTo(q),
		QueryValue: &computepb.GuestAttributesValue{Items: []*computepb.GuestAttributesEntry{
			{Namespace: ptrTo("hostkeys"), Key: ptrTo(fields[0]), Value: ptrTo(fields[1])},
		}},
		SelfLink: ptrTo(g.link("zones/" + zone + "/instances/" + name + "/getGuestAttributes")),
	})
}

func ptrTo[T any](v T) *T { return &v }
