package fakecloud

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
)

// Resource policies of the fake Compute Engine: a gang's compact
// placement (groupPlacementPolicy collocation COLLOCATED). An instance
// may name policies of its zone's region that exist; the instances of a
// COLLOCATED policy share one zone, and a policy with vmCount takes no
// more live instances than that. A policy in use cannot be deleted.

var (
	policiesPath         = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/regions/([^/]+)/resourcePolicies(?:/([^/]+))?$`)
	regionOperationsPath = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/regions/([^/]+)/operations/([^/]+?)(/wait)?$`)
	policyLinkPattern    = regexp.MustCompile(`(?:^|/)projects/([^/]+)/regions/([^/]+)/resourcePolicies/([^/]+)$`)
)

// ResourcePolicies returns the policies that exist, as "region/name", in
// name order.
func (g *GCE) ResourcePolicies() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for k := range g.policies {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// InPolicy returns the live instances ("zone/name") that name the
// policy region/name.
func (g *GCE) InPolicy(region, name string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, id := range g.order {
		if in, ok := g.instances[id]; ok && in.deleted.IsZero() && slices.Contains(in.policies, region+"/"+name) {
			out = append(out, id)
		}
	}
	return out
}

// FailNthOperation makes the operation of the nth insert from now (1 is
// the next) end with an error code: FailNthOperation(2,
// "ZONE_RESOURCE_POOL_EXHAUSTED") refuses a gang's second member.
func (g *GCE) FailNthOperation(n int, code string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failNthOp = nthFailure{n: n, code: code}
}

// nthOperationFailure reports the injected failure of this insert's
// operation, if it is the one.
func (g *GCE) nthOperationFailure() (string, bool) {
	if g.failNthOp.n <= 0 {
		return "", false
	}
	g.failNthOp.n--
	if g.failNthOp.n > 0 {
		return "", false
	}
	return g.failNthOp.code, true
}

// serveRegion answers the region-scoped calls: resource policies and
// region operations. It reports false for any other path.
func (g *GCE) serveRegion(w http.ResponseWriter, r *http.Request) bool {
	if m := regionOperationsPath.FindStringSubmatch(r.URL.Path); m != nil {
		g.calls["regionOperations"]++
		op, ok := g.ops[m[3]]
		if !ok || m[1] != g.opts.Project {
			writeGoogleError(w, http.StatusNotFound, "notFound", "The resource 'operations/"+m[3]+"' was not found")
			return true
		}
		writeProto(w, op)
		return true
	}
	m := policiesPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return false
	}
	if m[1] != g.opts.Project {
		writeGoogleError(w, http.StatusNotFound, "notFound", "no such project "+m[1])
		return true
	}
	region, name := m[2], m[3]
	switch {
	case name == "" && r.Method == http.MethodPost:
		g.calls["insertResourcePolicy"]++
		g.insertPolicy(w, r, region)
	case name != "" && r.Method == http.MethodGet:
		g.calls["getResourcePolicy"]++
		p, ok := g.policies[region+"/"+name]
		if !ok {
			writeGoogleError(w, http.StatusNotFound, "notFound", g.policyMissing(region, name))
			return true
		}
		writeProto(w, p)
	case name != "" && r.Method == http.MethodDelete:
		g.calls["deleteResourcePolicy"]++
		g.deletePolicy(w, region, name)
	default:
		writeGoogleError(w, http.StatusMethodNotAllowed, "badRequest", "unsupported method")
	}
	return true
}

func (g *GCE) policyMissing(region, name string) string {
	return fmt.Sprintf("The resource 'projects/%s/regions/%s/resourcePolicies/%s' was not found", g.opts.Project, region, name)
}

func (g *GCE) newRegionOp(kind, region, target string) *computepb.Operation {
	g.seq++
	op := &computepb.Operation{
		Kind: ptrTo("compute#operation"), Id: ptrTo(uint64(1000 + g.seq)), Name: ptrTo(fmt.Sprintf("operation-%d-%s", g.seq, kind)),
		Region: ptrTo(g.link("regions/" + region)), OperationType: ptrTo(kind), TargetLink: ptrTo(target),
		Status: computepb.Operation_RUNNING.Enum(), Progress: ptrTo(int32(0)),
		InsertTime: ptrTo(time.Now().UTC().Format(time.RFC3339)),
	}
	op.SelfLink = ptrTo(g.link("regions/" + region + "/operations/" + op.GetName()))
	g.ops[op.GetName()] = op
	return op
}

func (g *GCE) insertPolicy(w http.ResponseWriter, r *http.Request, region string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeGoogleError(w, http.StatusBadRequest, "badRequest", err.Error())
		return
	}
	p := &computepb.ResourcePolicy{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, p); err != nil {
		writeGoogleError(w, http.StatusBadRequest, "invalid", "Invalid JSON payload received: "+err.Error())
		return
	}
	name := p.GetName()
	gp := p.GetGroupPlacementPolicy()
	switch {
	case name == "":
		writeGoogleError(w, http.StatusBadRequest, "invalid", "Invalid value for field 'resource.name': ''.")
		return
	case gp == nil:
		writeGoogleError(w, http.StatusBadRequest, "invalid", "this fake knows only group placement policies")
		return
	case gp.Collocation != nil && gp.GetCollocation() != "COLLOCATED" && gp.GetCollocation() != "UNSPECIFIED_COLLOCATION":
		writeGoogleError(w, http.StatusBadRequest, "invalid", "Invalid value for field 'resource.groupPlacementPolicy.collocation': '"+gp.GetCollocation()+"'.")
		return
	}
	if _, ok := g.policies[region+"/"+name]; ok {
		writeGoogleError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/regions/%s/resourcePolicies/%s' already exists", g.opts.Project, region, name))
		return
	}
	target := g.link("regions/" + region + "/resourcePolicies/" + name)
	p.Region, p.SelfLink, p.Status = ptrTo(g.link("regions/"+region)), ptrTo(target), ptrTo("READY")
	p.Kind = ptrTo("compute#resourcePolicy")
	if g.policies == nil {
		g.policies = map[string]*computepb.ResourcePolicy{}
	}
	g.policies[region+"/"+name] = p
	op := g.newRegionOp("insert", region, target)
	finish(op, "", 0, "")
	writeProto(w, running(op))
}

func (g *GCE) deletePolicy(w http.ResponseWriter, region, name string) {
	if _, ok := g.policies[region+"/"+name]; !ok {
		writeGoogleError(w, http.StatusNotFound, "notFound", g.policyMissing(region, name))
		return
	}
	for _, in := range g.instances {
		if in.deleted.IsZero() && slices.Contains(in.policies, region+"/"+name) {
			writeGoogleError(w, http.StatusBadRequest, "resourceInUseByAnotherResource",
				fmt.Sprintf("The resource_policy resource 'projects/%s/regions/%s/resourcePolicies/%s' is already being used by '%s'", g.opts.Project, region, name, in.res.GetSelfLink()))
			return
		}
	}
	delete(g.policies, region+"/"+name)
	op := g.newRegionOp("delete", region, g.link("regions/"+region+"/resourcePolicies/"+name))
	finish(op, "", 0, "")
	writeProto(w, op)
}

// checkPolicies is insert's check of an instance's resourcePolicies: each
// exists in the zone's region; a COLLOCATED one's live instances are all
// in this zone, and no more than its vmCount. It returns the policies as
// "region/name", or an HTTP status, reason and message.
func (g *GCE) checkPolicies(res *computepb.Instance, zone string) (keys []string, status int, reason, msg string) {
	region := zone
	if i := strings.LastIndex(zone, "-"); i > 0 {
		region = zone[:i]
	}
	for _, link := range res.GetResourcePolicies() {
		m := policyLinkPattern.FindStringSubmatch(link)
		if m == nil {
			return nil, http.StatusBadRequest, "invalid", "Invalid value for field 'resource.resourcePolicies[0]': '" + link + "'."
		}
		if m[2] != region {
			return nil, http.StatusBadRequest, "invalid", fmt.Sprintf("Resource policy %s is in region %s; the instance's zone %s is not", m[3], m[2], zone)
		}
		key := m[2] + "/" + m[3]
		p, ok := g.policies[key]
		if !ok || m[1] != g.opts.Project {
			return nil, http.StatusNotFound, "notFound", g.policyMissing(m[2], m[3])
		}
		live := 0
		for _, in := range g.instances {
			if !in.deleted.IsZero() || !slices.Contains(in.policies, key) {
				continue
			}
			live++
			if in.zone != zone {
				return nil, http.StatusBadRequest, "invalid", fmt.Sprintf("Compact placement policy %s holds instances in %s; it cannot span zones (%s)", m[3], in.zone, zone)
			}
		}
		if n := p.GetGroupPlacementPolicy().GetVmCount(); n > 0 && int32(live) >= n {
			return nil, http.StatusBadRequest, "invalid", fmt.Sprintf("Resource policy %s already holds its %d instances", m[3], n)
		}
		keys = append(keys, key)
	}
	return keys, 0, "", ""
}
