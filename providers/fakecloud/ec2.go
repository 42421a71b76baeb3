package fakecloud

import (
	"cmp"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/crypto/ssh"
)

// EC2Options configures a fake EC2 endpoint.
type EC2Options struct {
	// Region is reported in availability zones; default us-east-1.
	Region string
	// SSHD boots a real sshd for every instance, reachable at the
	// instance's public IP and SSHPort(). Without it instances have
	// addresses and published host keys but nothing listens.
	SSHD bool
	// Capacity caps how many live instances of an instance type may exist;
	// types not listed are unlimited.
	Capacity map[string]int
	// Machines, when set, runs every instance's guest with this server
	// instead of sshd.
	Machines MachineServer
	// BootTime is how long an instance stays pending (and prints nothing
	// on its console); ShutdownTime how long it stays shutting-down.
	BootTime, ShutdownTime time.Duration
	// SpotPrices are what DescribeSpotPriceHistory answers, newest last.
	SpotPrices []SpotPrice
	// Prices are the on-demand Linux prices the same endpoint's Price
	// List Query API (GetProducts, pricing.go) answers with; give the
	// endpoint's URL as the provider's pricingEndpoint.
	Prices []OnDemandPrice
}

// SpotPrice is one entry of the spot price history.
type SpotPrice struct {
	InstanceType, Zone string
	// Price per hour, as EC2 writes it ("12.345600").
	Price string
	At    time.Time
}

// EC2 is a fake EC2 Query API (form-encoded POST, XML answers) for the
// calls Spillway makes: RunInstances, DescribeInstances,
// TerminateInstances, GetConsoleOutput, placement groups and the spot
// price history; and, on the same endpoint, the Price List Query API's
// GetProducts (JSON, told apart by its X-Amz-Target header).
type EC2 struct {
	// URL is the endpoint to give the SDK (BaseEndpoint).
	URL string

	opts  EC2Options
	fleet *fleet
	srv   *httptest.Server

	mu        sync.Mutex
	instances map[string]*ec2Instance
	order     []string
	tokens    map[string]string // client token → instance id
	failNext  map[string]string // action → error code
	failNth   map[string]nthFailure
	groups    map[string]*placementGroup
	calls     map[string]int
	seq       int
}

type ec2Instance struct {
	id, token, instanceType, zone string
	group                         string // placement group, if any
	spot                          bool
	tags                          map[string]string
	launched                      time.Time // when RunInstances ran
	terminated                    time.Time // when TerminateInstances ran; zero before
	userData                      string
	m                             *machine
	consoleKey                    ssh.PublicKey // overrides the published key when set
}

// state is the instance's state now: it boots for BootTime, and shuts down
// for ShutdownTime after a terminate.
func (e *EC2) state(in *ec2Instance) string {
	now := time.Now()
	switch {
	case !in.terminated.IsZero() && now.Sub(in.terminated) >= e.opts.ShutdownTime:
		return "terminated"
	case !in.terminated.IsZero():
		return "shutting-down"
	case now.Sub(in.launched) >= e.opts.BootTime:
		return "running"
	default:
		return "pending"
	}
}

// StartEC2 starts a fake EC2 endpoint on 127.0.0.1. Its machines run
// opts.Machines when set (`spillway dev --burst` rents from it), else a
// real sshd each with opts.SSHD. Close ends it and its machines.
func StartEC2(opts EC2Options) (*EC2, error) {
	opts.Region = cmp.Or(opts.Region, "us-east-1")
	fl, err := newFleet(opts.SSHD, opts.Machines)
	if err != nil {
		return nil, err
	}
	e := &EC2{
		opts: opts, fleet: fl,
		instances: map[string]*ec2Instance{}, tokens: map[string]string{},
		failNext: map[string]string{}, calls: map[string]int{},
	}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	e.URL = e.srv.URL
	return e, nil
}

// Close ends the endpoint, then every machine.
func (e *EC2) Close() {
	e.srv.Close()
	e.fleet.stopAll()
}

// SSHPort is the port every instance's sshd listens on.
func (e *EC2) SSHPort() int { return e.fleet.port }

// EC2Client returns an SDK client for the fake, with static credentials,
// for providers/aws.NewWithAPI.
func EC2Client(e *EC2) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:       e.opts.Region,
		BaseEndpoint: awssdk.String(e.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDFAKECLOUD", "fakecloud-secret", ""),
	})
}

// FailNext makes the next call of action ("RunInstances") fail with the
// EC2 error code ("InsufficientInstanceCapacity").
func (e *EC2) FailNext(action, code string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failNext[action] = code
}

// nthFailure is an injected failure of the nth call from now.
type nthFailure struct {
	n    int
	code string
}

// FailNth makes the nth call of action from now (1 is the next) fail with
// the EC2 error code: FailNth("RunInstances", 2,
// "InsufficientInstanceCapacity") refuses a gang's second member.
func (e *EC2) FailNth(action string, n int, code string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failNth == nil {
		e.failNth = map[string]nthFailure{}
	}
	e.failNth[action] = nthFailure{n: n, code: code}
}

// SetCapacity caps live instances of instanceType.
func (e *EC2) SetCapacity(instanceType string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.opts.Capacity == nil {
		e.opts.Capacity = map[string]int{}
	}
	e.opts.Capacity[instanceType] = n
}

// Calls returns how many times action was called.
func (e *EC2) Calls(action string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[action]
}

// EC2Instance is a snapshot of a fake instance.
type EC2Instance struct {
	ID, ClientToken, InstanceType, Zone, State string
	Spot                                       bool
	Tags                                       map[string]string
	UserData                                   string
	IP                                         string
	HostKey                                    ssh.PublicKey
	SSHD                                       *SSHHost
}

// Instances returns every instance ever launched, terminated included, in
// launch order.
func (e *EC2) Instances() []EC2Instance {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []EC2Instance
	for _, id := range e.order {
		in := e.instances[id]
		out = append(out, EC2Instance{
			ID: in.id, ClientToken: in.token, InstanceType: in.instanceType, Zone: in.zone, State: e.state(in),
			Spot: in.spot, Tags: maps.Clone(in.tags), UserData: in.userData,
			IP: in.m.ip, HostKey: in.m.hostKey, SSHD: in.m.sshd,
		})
	}
	return out
}

// PublishHostKey makes the instance's console output show key instead of
// its real host key: a machine whose key was swapped.
func (e *EC2) PublishHostKey(id string, key ssh.PublicKey) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if in, ok := e.instances[id]; ok {
		in.consoleKey = key
	}
}

// ec2Error is the Query API's error document.
type ec2Error struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

// ec2ErrorStatus is the HTTP status EC2 answers with for a code.
func ec2ErrorStatus(code string) int {
	switch code {
	case "AuthFailure", "UnauthorizedOperation":
		return http.StatusForbidden
	case "InternalError", "Unavailable":
		return http.StatusInternalServerError
	default:
		return http.StatusBadRequest
	}
}

func (e *EC2) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if target := r.Header.Get("X-Amz-Target"); target != "" {
		e.servePricing(w, r, target)
		return
	}
	if err := r.ParseForm(); err != nil {
		writeEC2Error(w, "MalformedQueryString", err.Error())
		return
	}
	f := r.PostForm
	action := f.Get("Action")
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[action]++
	if code, ok := e.failNext[action]; ok {
		delete(e.failNext, action)
		writeEC2Error(w, code, "injected failure")
		return
	}
	if nf, ok := e.failNth[action]; ok {
		if nf.n--; nf.n > 0 {
			e.failNth[action] = nf
		} else {
			delete(e.failNth, action)
			msg := "injected failure"
			if nf.code == "InsufficientInstanceCapacity" {
				msg = "We currently do not have sufficient " + f.Get("InstanceType") + " capacity in the Availability Zone you requested."
			}
			writeEC2Error(w, nf.code, msg)
			return
		}
	}
	switch action {
	case "RunInstances":
		e.runInstances(w, f)
	case "DescribeInstances":
		e.describeInstances(w, f)
	case "TerminateInstances":
		e.terminateInstances(w, f)
	case "GetConsoleOutput":
		e.getConsoleOutput(w, f)
	case "CreatePlacementGroup":
		e.createPlacementGroup(w, f)
	case "DeletePlacementGroup":
		e.deletePlacementGroup(w, f)
	case "DescribeSpotPriceHistory":
		e.describeSpotPriceHistory(w, f)
	default:
		writeEC2Error(w, "InvalidAction", "the action "+action+" is not valid for this web service")
	}
}

func writeEC2Error(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(ec2ErrorStatus(code))
	_ = xml.NewEncoder(w).Encode(ec2Error{Code: code, Message: msg, RequestID: "fake-request"})
}

// indexed collects "Prefix.N.Rest" form keys by N.
func indexed(f url.Values, prefix string) map[int]url.Values {
	out := map[int]url.Values{}
	for k, vs := range f {
		rest, ok := strings.CutPrefix(k, prefix+".")
		if !ok {
			continue
		}
		n, tail, _ := strings.Cut(rest, ".")
		i, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if out[i] == nil {
			out[i] = url.Values{}
		}
		out[i][tail] = vs
	}
	return out
}

func sortedValues(m map[int]url.Values) []url.Values {
	var out []url.Values
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

func (e *EC2) live(instanceType string) int {
	n := 0
	for _, in := range e.instances {
		if in.instanceType == instanceType && in.terminated.IsZero() {
			n++
		}
	}
	return n
}

func (e *EC2) runInstances(w http.ResponseWriter, f url.Values) {
	if f.Get("ImageId") == "" || f.Get("InstanceType") == "" || f.Get("MinCount") != "1" || f.Get("MaxCount") != "1" {
		writeEC2Error(w, "MissingParameter", "ImageId, InstanceType and MinCount=MaxCount=1 are required here")
		return
	}
	token := f.Get("ClientToken")
	if id, ok := e.tokens[token]; ok && token != "" {
		in := e.instances[id]
		if in.instanceType != f.Get("InstanceType") {
			writeEC2Error(w, "IdempotentParameterMismatch", "client token reused with other parameters")
			return
		}
		e.writeReservation(w, "RunInstancesResponse", in)
		return
	}
	it := f.Get("InstanceType")
	if c, ok := e.opts.Capacity[it]; ok && e.live(it) >= c {
		writeEC2Error(w, "InsufficientInstanceCapacity", "We currently do not have sufficient "+it+" capacity in the Availability Zone you requested.")
		return
	}
	tags := map[string]string{}
	for _, spec := range indexed(f, "TagSpecification") {
		if spec.Get("ResourceType") != "instance" {
			continue
		}
		for _, tag := range indexed(spec, "Tag") {
			tags[tag.Get("Key")] = tag.Get("Value")
		}
	}
	userData := ""
	if ud := f.Get("UserData"); ud != "" {
		b, err := base64.StdEncoding.DecodeString(ud)
		if err != nil {
			writeEC2Error(w, "InvalidParameterValue", "UserData is not base64")
			return
		}
		userData = string(b)
	}
	ci, err := ParseUserData(userData)
	if err != nil {
		writeEC2Error(w, "InvalidUserData.Malformed", err.Error())
		return
	}
	m, err := e.fleet.boot(ci)
	if err != nil {
		writeEC2Error(w, "InternalError", err.Error())
		return
	}
	zone := f.Get("Placement.AvailabilityZone")
	if zone == "" {
		zone = e.opts.Region + "a"
	}
	group := f.Get("Placement.GroupName")
	if code, msg := e.placementCheck(group, zone); code != "" {
		m.stop()
		writeEC2Error(w, code, msg)
		return
	}
	e.seq++
	in := &ec2Instance{
		id: fmt.Sprintf("i-%017x", e.seq), token: token, instanceType: it, zone: zone,
		spot: f.Get("InstanceMarketOptions.MarketType") == "spot", tags: tags,
		launched: time.Now(), userData: userData, m: m, group: group,
	}
	e.instances[in.id] = in
	e.order = append(e.order, in.id)
	if token != "" {
		e.tokens[token] = in.id
	}
	e.writeReservation(w, "RunInstancesResponse", in)
}

func (e *EC2) describeInstances(w http.ResponseWriter, f url.Values) {
	ids := f["InstanceId.1"]
	for i := 2; f.Get("InstanceId."+strconv.Itoa(i)) != ""; i++ {
		ids = append(ids, f.Get("InstanceId."+strconv.Itoa(i)))
	}
	for _, id := range ids {
		if _, ok := e.instances[id]; !ok {
			writeEC2Error(w, "InvalidInstanceID.NotFound", "The instance ID '"+id+"' does not exist")
			return
		}
	}
	filters := sortedValues(indexed(f, "Filter"))
	var match []*ec2Instance
	for _, id := range e.order {
		in := e.instances[id]
		if len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		if !ec2Matches(in, e.state(in), filters) {
			continue
		}
		match = append(match, in)
	}
	type reservation struct {
		ReservationID string    `xml:"reservationId"`
		OwnerID       string    `xml:"ownerId"`
		Instances     []xmlInst `xml:"instancesSet>item"`
	}
	var out struct {
		XMLName      xml.Name      `xml:"DescribeInstancesResponse"`
		Xmlns        string        `xml:"xmlns,attr"`
		RequestID    string        `xml:"requestId"`
		Reservations []reservation `xml:"reservationSet>item"`
	}
	out.Xmlns, out.RequestID = ec2Xmlns, "fake-request"
	for _, in := range match {
		out.Reservations = append(out.Reservations, reservation{ReservationID: "r-" + in.id[2:], OwnerID: "123456789012", Instances: []xmlInst{e.toXML(in)}})
	}
	writeXML(w, out)
}

func ec2Matches(in *ec2Instance, state string, filters []url.Values) bool {
	for _, flt := range filters {
		name := flt.Get("Name")
		var values []string
		for _, v := range sortedValues(indexed(flt, "Value")) {
			values = append(values, v.Get(""))
		}
		var have string
		var ok bool
		switch {
		case strings.HasPrefix(name, "tag:"):
			have, ok = in.tags[strings.TrimPrefix(name, "tag:")]
		case name == "tag-key":
			_, ok = in.tags[values[0]]
			if !ok {
				return false
			}
			continue
		case name == "instance-state-name":
			have, ok = state, true
		case name == "client-token":
			have, ok = in.token, true
		default:
			return false
		}
		if !ok || !slices.Contains(values, have) {
			return false
		}
	}
	return true
}

func (e *EC2) terminateInstances(w http.ResponseWriter, f url.Values) {
	type change struct {
		InstanceID string   `xml:"instanceId"`
		Current    xmlState `xml:"currentState"`
		Previous   xmlState `xml:"previousState"`
	}
	var out struct {
		XMLName   xml.Name `xml:"TerminateInstancesResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		Changes   []change `xml:"instancesSet>item"`
	}
	out.Xmlns, out.RequestID = ec2Xmlns, "fake-request"
	for _, v := range sortedValues(indexed(f, "InstanceId")) {
		id := v.Get("")
		in, ok := e.instances[id]
		if !ok {
			writeEC2Error(w, "InvalidInstanceID.NotFound", "The instance ID '"+id+"' does not exist")
			return
		}
		prev := e.state(in)
		if in.terminated.IsZero() {
			in.terminated = time.Now()
			in.m.stop()
		}
		out.Changes = append(out.Changes, change{InstanceID: id, Current: stateOf(e.state(in)), Previous: stateOf(prev)})
	}
	writeXML(w, out)
}

func (e *EC2) getConsoleOutput(w http.ResponseWriter, f url.Values) {
	id := f.Get("InstanceId")
	in, ok := e.instances[id]
	if !ok {
		writeEC2Error(w, "InvalidInstanceID.NotFound", "The instance ID '"+id+"' does not exist")
		return
	}
	var out struct {
		XMLName    xml.Name `xml:"GetConsoleOutputResponse"`
		Xmlns      string   `xml:"xmlns,attr"`
		RequestID  string   `xml:"requestId"`
		InstanceID string   `xml:"instanceId"`
		Timestamp  string   `xml:"timestamp"`
		Output     string   `xml:"output,omitempty"`
	}
	out.Xmlns, out.RequestID, out.InstanceID = ec2Xmlns, "fake-request", id
	out.Timestamp = time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	// Nothing is printed before the machine has booted.
	if e.state(in) == "running" {
		m := *in.m
		if in.consoleKey != nil {
			m.hostKey = in.consoleKey
		}
		out.Output = base64.StdEncoding.EncodeToString([]byte(m.consoleOutput("ip-" + strings.ReplaceAll(m.ip, ".", "-"))))
	}
	writeXML(w, out)
}

const ec2Xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

func stateOf(s string) xmlState {
	return xmlState{Code: map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48}[s], Name: s}
}

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type xmlInst struct {
	InstanceID        string   `xml:"instanceId"`
	ImageID           string   `xml:"imageId"`
	State             xmlState `xml:"instanceState"`
	InstanceType      string   `xml:"instanceType"`
	LaunchTime        string   `xml:"launchTime"`
	AvailabilityZone  string   `xml:"placement>availabilityZone"`
	GroupName         string   `xml:"placement>groupName,omitempty"`
	PrivateIPAddress  string   `xml:"privateIpAddress"`
	IPAddress         string   `xml:"ipAddress,omitempty"`
	ClientToken       string   `xml:"clientToken,omitempty"`
	InstanceLifecycle string   `xml:"instanceLifecycle,omitempty"`
	Tags              []xmlTag `xml:"tagSet>item"`
}

func (e *EC2) toXML(in *ec2Instance) xmlInst {
	state := e.state(in)
	x := xmlInst{
		InstanceID: in.id, ImageID: "ami-fake", State: stateOf(state), InstanceType: in.instanceType,
		LaunchTime: in.launched.UTC().Format("2006-01-02T15:04:05.000Z"), AvailabilityZone: in.zone,
		PrivateIPAddress: in.m.ip, ClientToken: in.token, GroupName: in.group,
	}
	if state == "running" || state == "pending" {
		x.IPAddress = in.m.ip
	}
	if in.spot {
		x.InstanceLifecycle = "spot"
	}
	for _, k := range slices.Sorted(maps.Keys(in.tags)) {
		x.Tags = append(x.Tags, xmlTag{Key: k, Value: in.tags[k]})
	}
	return x
}

func (e *EC2) writeReservation(w http.ResponseWriter, root string, in *ec2Instance) {
	var out struct {
		XMLName       xml.Name
		Xmlns         string    `xml:"xmlns,attr"`
		RequestID     string    `xml:"requestId"`
		ReservationID string    `xml:"reservationId"`
		OwnerID       string    `xml:"ownerId"`
		Instances     []xmlInst `xml:"instancesSet>item"`
	}
	out.XMLName.Local = root
	out.Xmlns, out.RequestID, out.ReservationID, out.OwnerID = ec2Xmlns, "fake-request", "r-"+in.id[2:], "123456789012"
	out.Instances = []xmlInst{e.toXML(in)}
	writeXML(w, out)
}

func writeXML(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(v)
}

// describeSpotPriceHistory answers with the configured history of the
// requested instance types (InstanceType.N) and product (Linux/UNIX).
func (e *EC2) describeSpotPriceHistory(w http.ResponseWriter, f url.Values) {
	want := map[string]bool{}
	for _, v := range sortedValues(indexed(f, "InstanceType")) {
		want[v.Get("")] = true
	}
	type item struct {
		InstanceType       string `xml:"instanceType"`
		ProductDescription string `xml:"productDescription"`
		SpotPrice          string `xml:"spotPrice"`
		Timestamp          string `xml:"timestamp"`
		AvailabilityZone   string `xml:"availabilityZone"`
	}
	var resp struct {
		XMLName   xml.Name `xml:"DescribeSpotPriceHistoryResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		Items     []item   `xml:"spotPriceHistorySet>item"`
	}
	resp.Xmlns, resp.RequestID = "http://ec2.amazonaws.com/doc/2016-11-15/", "fake-request"
	for _, p := range e.opts.SpotPrices {
		if len(want) == 0 || want[p.InstanceType] {
			resp.Items = append(resp.Items, item{InstanceType: p.InstanceType, ProductDescription: "Linux/UNIX",
				SpotPrice: p.Price, Timestamp: p.At.UTC().Format(time.RFC3339), AvailabilityZone: p.Zone})
		}
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_ = xml.NewEncoder(w).Encode(resp)
}
