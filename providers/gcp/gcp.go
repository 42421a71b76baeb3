// Package gcp is the Compute Engine provider, on
// cloud.google.com/go/compute/apiv1's REST clients.
//
// One Provider serves one project and the zones its machine types list.
// Machines are created with instances.insert (requestId derived from the
// broker's record id, and an instance name derived from it too, so a
// retried create neither launches twice nor leaks), with guest
// accelerators, the SPOT provisioning model where asked, labels for the
// cluster, the record and the request's tags, and the broker's key in the
// ssh-keys metadata. Create waits on the zone operation
// (zoneOperations.wait), since Compute Engine reports a stock-out
// (ZONE_RESOURCE_POOL_EXHAUSTED) only there. Host keys come from the guest
// attributes under hostkeys/, which the guest agent publishes when the
// metadata enable-guest-attributes is TRUE.
//
// Credentials come from Application Default Credentials; extra client
// options (an endpoint, option.WithoutAuthentication for an emulator) can
// be passed to New.
package gcp

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2"
	"golang.org/x/crypto/ssh"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
)

// InstancesAPI is the part of the instances client this package uses;
// *compute.InstancesClient implements it.
type InstancesAPI interface {
	Insert(ctx context.Context, req *computepb.InsertInstanceRequest, opts ...gax.CallOption) (*compute.Operation, error)
	Get(ctx context.Context, req *computepb.GetInstanceRequest, opts ...gax.CallOption) (*computepb.Instance, error)
	List(ctx context.Context, req *computepb.ListInstancesRequest, opts ...gax.CallOption) *compute.InstanceIterator
	Delete(ctx context.Context, req *computepb.DeleteInstanceRequest, opts ...gax.CallOption) (*compute.Operation, error)
	GetGuestAttributes(ctx context.Context, req *computepb.GetGuestAttributesInstanceRequest, opts ...gax.CallOption) (*computepb.GuestAttributes, error)
}

// OperationsAPI is the part of the zone operations client this package
// uses; *compute.ZoneOperationsClient implements it.
type OperationsAPI interface {
	Wait(ctx context.Context, req *computepb.WaitZoneOperationRequest, opts ...gax.CallOption) (*computepb.Operation, error)
}

// Config is one Compute Engine provider under the broker config's
// `providers:` key.
type Config struct {
	// Name is the provider's name in offers and records; default
	// "gcp-<project>".
	Name string `json:"name,omitempty"`
	// Cluster is the cluster label value; List only sees machines with it.
	Cluster string `json:"cluster"`
	Project string `json:"project"`
	// Region names the offers' region; informational.
	Region string `json:"region"`
	// Endpoint overrides the Compute Engine endpoint.
	Endpoint string `json:"endpoint,omitempty"`
	// Image is the boot image, e.g.
	// "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts".
	Image string `json:"image"`
	// DiskSizeGB is the boot disk size; default 200.
	DiskSizeGB int64 `json:"diskSizeGB,omitempty"`
	// Network and Subnetwork place the NIC; default the "default" network.
	Network    string `json:"network,omitempty"`
	Subnetwork string `json:"subnetwork,omitempty"`
	// NoExternalIP leaves the machine without a public address; the
	// broker then connects to its internal IP.
	NoExternalIP bool `json:"noExternalIp,omitempty"`
	// ServiceAccount is an optional service account email for the VM.
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// SSHUser is created by the guest agent from the ssh-keys metadata;
	// default "spillway".
	SSHUser string `json:"sshUser,omitempty"`
	// SSHPort is where sshd listens; default 22.
	SSHPort int `json:"sshPort,omitempty"`
	// Currency of the prices; default "USD".
	Currency string `json:"currency,omitempty"`
	// MachineTypes are what this provider offers, with prices from this
	// table (GCE has no spot price feed; the operator keeps the table).
	MachineTypes []MachineType `json:"machineTypes"`
	// MetadataEndpoint is the metadata server the agent on a SPOT machine
	// waits on for instance/preempted; default
	// http://metadata.google.internal (a mock in tests).
	MetadataEndpoint string `json:"metadataEndpoint,omitempty"`
}

// MachineType is one machine type on offer.
type MachineType struct {
	// Name is the machine type, e.g. "a3-highgpu-8g" or "n1-standard-8".
	Name string `json:"name"`
	// AcceleratorType is attached as guest accelerators, e.g.
	// "nvidia-tesla-t4"; leave empty for types with built-in GPUs (A2, A3,
	// G2), which Compute Engine attaches itself.
	AcceleratorType string `json:"acceleratorType,omitempty"`
	// GPUModel is the short normalised model: "H100", "A100-80GB", "L4".
	GPUModel     string `json:"gpuModel"`
	GPUs         int    `json:"gpus"`
	GPUMemoryGiB int    `json:"gpuMemoryGiB"`
	CPUs         int    `json:"cpus"`
	MemoryGiB    int    `json:"memoryGiB"`
	// Zones to offer it in; Compute Engine is zonal, so at least one.
	Zones []string `json:"zones"`
	// OnDemandPrice per hour; zero offers no standard provisioning.
	OnDemandPrice billing.Amount `json:"onDemandPrice,omitempty"`
	// SpotPrice per hour; zero offers no SPOT provisioning.
	SpotPrice billing.Amount `json:"spotPrice,omitempty"`
}

// LabelPrefix starts every label key this provider writes
// ("spillway-cluster").
const LabelPrefix = "spillway-"

// Metadata keys this provider writes.
const (
	metaRecord       = "spillway-record"
	metaTags         = "spillway-tags"
	metaSSHKeys      = "ssh-keys"
	metaUserData     = "user-data"
	metaGuestAttribs = "enable-guest-attributes"
)

const providerKind = "gcp"

// Provider is the Compute Engine provider.
type Provider struct {
	cfg Config
	ins InstancesAPI
	ops OperationsAPI
	// pol and rops make a gang's compact placement policy (placement.go).
	pol  PoliciesAPI
	rops RegionOperationsAPI
}

// New builds a provider on the REST clients, with Application Default
// Credentials unless opts say otherwise.
func New(ctx context.Context, cfg Config, opts ...option.ClientOption) (*Provider, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if cfg.Endpoint != "" {
		opts = append([]option.ClientOption{option.WithEndpoint(cfg.Endpoint)}, opts...)
	}
	ins, err := compute.NewInstancesRESTClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("create instances client: %w", err)
	}
	ops, err := compute.NewZoneOperationsRESTClient(ctx, opts...)
	if err != nil {
		ins.Close()
		return nil, fmt.Errorf("create zone operations client: %w", err)
	}
	pol, rops, err := placementClients(ctx, opts)
	if err != nil {
		ins.Close()
		ops.Close()
		return nil, err
	}
	return &Provider{cfg: cfg, ins: ins, ops: ops, pol: pol, rops: rops}, nil
}

// NewWithAPI builds a provider on given clients.
func NewWithAPI(cfg Config, ins InstancesAPI, ops OperationsAPI) (*Provider, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Provider{cfg: cfg, ins: ins, ops: ops}, nil
}

// Validate checks the section as the broker config gives it (cluster
// filled in from the config's cluster); each problem is a
// *providers.ConfigError naming its field.
func (c *Config) Validate() error {
	var errs providers.ConfigErrors
	if c.Cluster == "" {
		errs.Add("cluster", "is required")
	}
	if c.Project == "" {
		errs.Add("project", "is required")
	}
	if c.Image == "" {
		errs.Add("image", "is required, e.g. projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts")
	}
	if len(c.MachineTypes) == 0 {
		errs.Add("machineTypes", "needs at least one machine type")
	}
	for i, mt := range c.MachineTypes {
		if mt.Name == "" || len(mt.Zones) == 0 || (mt.OnDemandPrice <= 0 && mt.SpotPrice <= 0) {
			errs.Add(fmt.Sprintf("machineTypes[%d]", i), "want a name, zones and an onDemandPrice or spotPrice above 0")
		}
	}
	return errs.Err()
}

func (c *Config) defaults() error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("gcp config: %w", err)
	}
	c.Name = cmp.Or(c.Name, "gcp-"+c.Project)
	c.DiskSizeGB = cmp.Or(c.DiskSizeGB, 200)
	c.Network = cmp.Or(c.Network, "global/networks/default")
	c.SSHUser = cmp.Or(c.SSHUser, "spillway")
	c.SSHPort = cmp.Or(c.SSHPort, 22)
	c.Currency = cmp.Or(c.Currency, "USD")
	return nil
}

// Name returns the configured name.
func (p *Provider) Name() string { return p.cfg.Name }

// Offers lists each machine type in each of its zones, standard and spot
// where a price is set. Every offer is Available; a stock-out shows at
// create time as ErrInsufficientCapacity.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	var out []providers.Offer
	for _, mt := range p.cfg.MachineTypes {
		for _, z := range mt.Zones {
			base := providers.Offer{
				Provider: p.cfg.Name, Region: p.cfg.Region, Zone: z, InstanceType: mt.Name,
				GPUModel: mt.GPUModel, GPUs: mt.GPUs, GPUMemoryBytes: int64(mt.GPUMemoryGiB) << 30,
				CPUs: mt.CPUs, MemoryBytes: int64(mt.MemoryGiB) << 30,
				Currency: p.cfg.Currency, Available: true, PriceSource: providers.PriceFromConfig,
			}
			if mt.OnDemandPrice > 0 {
				o := base
				o.PricePerHour = mt.OnDemandPrice
				out = append(out, o)
			}
			if mt.SpotPrice > 0 {
				o := base
				o.Spot, o.PricePerHour = true, mt.SpotPrice
				out = append(out, o)
			}
		}
	}
	return out, nil
}

func (p *Provider) machineType(name string) MachineType {
	for _, mt := range p.cfg.MachineTypes {
		if mt.Name == name {
			return mt
		}
	}
	return MachineType{}
}

// InstanceName is the Compute Engine name for a record id: "spw-" and the
// id in lower case, '_' as '-'. One record id, one name: a second insert
// fails with alreadyExists instead of launching again.
func InstanceName(recordID string) string {
	return "spw-" + strings.ReplaceAll(strings.ToLower(recordID), "_", "-")
}

// RequestID is the insert's requestId for a record id: a UUID (version 5
// style) from the SHA-1 of the id, as Compute Engine wants a UUID.
func RequestID(recordID string) string {
	h := sha1.Sum([]byte("spillway-insert:" + recordID))
	h[6] = (h[6] & 0x0f) | 0x50
	h[8] = (h[8] & 0x3f) | 0x80
	b := h[:16]
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// labelValue fits a value into a label: lower-case letters, digits, '-'
// and '_', at most 63 characters. Exact values live in the metadata.
func labelValue(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

// Create inserts one instance and waits for the insert operation.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (*providers.Instance, error) {
	if err := req.Validate(); err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	offers, _ := p.Offers(ctx)
	offer, ok := providers.FindOffer(offers, req.Offer)
	if !ok {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", fmt.Errorf("no offer %s", req.Offer.Key()))
	}
	inst, err := p.instanceResource(req, offer)
	if err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	if req.Placement != "" {
		link, err := p.ensurePlacement(ctx, offer.Zone, req.Placement)
		if err != nil {
			return nil, err
		}
		inst.ResourcePolicies = []string{link}
	}
	op, err := p.ins.Insert(ctx, &computepb.InsertInstanceRequest{
		Project: p.cfg.Project, Zone: offer.Zone, RequestId: ptr(RequestID(req.RecordID)), InstanceResource: inst,
	})
	switch {
	case err != nil && googleReason(err) == "alreadyExists":
		// An earlier create got this far (its request id expired, or it
		// came from another broker process): take the machine if it is
		// this record's.
		return p.adopt(ctx, offer.Zone, req.RecordID)
	case err != nil:
		return nil, mapError("create", err)
	}
	if err := p.wait(ctx, offer.Zone, op.Proto()); err != nil {
		return nil, err
	}
	return p.Get(ctx, offer.Zone+"/"+InstanceName(req.RecordID))
}

func (p *Provider) adopt(ctx context.Context, zone, record string) (*providers.Instance, error) {
	got, err := p.Get(ctx, zone+"/"+InstanceName(record))
	if err != nil {
		return nil, err
	}
	if got.RecordID != record {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "alreadyExists",
			fmt.Errorf("instance %s exists for record %q", got.ID, got.RecordID))
	}
	return got, nil
}

// instanceResource is the instance to insert for req.
func (p *Provider) instanceResource(req providers.CreateRequest, offer providers.Offer) (*computepb.Instance, error) {
	mt := p.machineType(offer.InstanceType)
	labels := map[string]string{}
	for k, v := range providers.EncodeTags(LabelPrefix, labelValue(p.cfg.Cluster), labelValue(req.RecordID), req.Tags) {
		labels[k] = labelValue(v)
	}
	tags, err := json.Marshal(req.Tags)
	if err != nil {
		return nil, fmt.Errorf("encode tags: %w", err)
	}
	meta := []*computepb.Items{
		{Key: ptr(metaRecord), Value: ptr(req.RecordID)},
		{Key: ptr(metaTags), Value: ptr(string(tags))},
		{Key: ptr(metaGuestAttribs), Value: ptr("TRUE")},
	}
	if req.SSHAuthorizedKey != "" {
		meta = append(meta, &computepb.Items{Key: ptr(metaSSHKeys), Value: ptr(p.cfg.SSHUser + ":" + strings.TrimSpace(req.SSHAuthorizedKey))})
	}
	if req.UserData != "" {
		meta = append(meta, &computepb.Items{Key: ptr(metaUserData), Value: ptr(req.UserData)})
	}
	nic := &computepb.NetworkInterface{Network: ptr(p.cfg.Network)}
	if p.cfg.Subnetwork != "" {
		nic.Subnetwork = ptr(p.cfg.Subnetwork)
	}
	if !p.cfg.NoExternalIP {
		nic.AccessConfigs = []*computepb.AccessConfig{{Name: ptr("External NAT"), Type: ptr("ONE_TO_ONE_NAT")}}
	}
	sched := &computepb.Scheduling{OnHostMaintenance: ptr("TERMINATE"), AutomaticRestart: ptr(!offer.Spot)}
	if offer.Spot {
		sched.ProvisioningModel = ptr("SPOT")
		sched.InstanceTerminationAction = ptr("DELETE")
	}
	inst := &computepb.Instance{
		Name:        ptr(InstanceName(req.RecordID)),
		MachineType: ptr(path.Join("zones", offer.Zone, "machineTypes", offer.InstanceType)),
		Labels:      labels,
		Metadata:    &computepb.Metadata{Items: meta},
		Scheduling:  sched,
		Disks: []*computepb.AttachedDisk{{
			Boot: ptr(true), AutoDelete: ptr(true),
			InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: ptr(p.cfg.Image), DiskSizeGb: ptr(p.cfg.DiskSizeGB)},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{nic},
	}
	if mt.AcceleratorType != "" && mt.GPUs > 0 {
		inst.GuestAccelerators = []*computepb.AcceleratorConfig{{
			AcceleratorType:  ptr(path.Join("zones", offer.Zone, "acceleratorTypes", mt.AcceleratorType)),
			AcceleratorCount: ptr(int32(mt.GPUs)),
		}}
	}
	if p.cfg.ServiceAccount != "" {
		inst.ServiceAccounts = []*computepb.ServiceAccount{{Email: ptr(p.cfg.ServiceAccount), Scopes: []string{"https://www.googleapis.com/auth/cloud-platform"}}}
	}
	return inst, nil
}

// wait blocks on zoneOperations.wait until the operation is DONE, and
// maps an operation error onto an error kind.
func (p *Provider) wait(ctx context.Context, zone string, op *computepb.Operation) error {
	for op.GetStatus() != computepb.Operation_DONE {
		var err error
		op, err = p.ops.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: p.cfg.Project, Zone: zone, Operation: op.GetName()})
		if err != nil {
			return mapError("wait", err)
		}
		if ctx.Err() != nil {
			return providers.NewError(providers.ErrUnavailable, providerKind, "wait", "", ctx.Err())
		}
	}
	if errs := op.GetError().GetErrors(); len(errs) > 0 {
		code := errs[0].GetCode()
		fallback := providers.ErrUnavailable
		if c := int(op.GetHttpErrorStatusCode()); c >= 400 && c < 500 {
			fallback = providers.ErrInvalidRequest
		}
		return errorCodes.Map(providerKind, "create", code, fallback, errors.New(errs[0].GetMessage()))
	}
	return nil
}

// splitID parses "zone/name".
func splitID(op, id string) (zone, name string, err error) {
	zone, name, ok := strings.Cut(id, "/")
	if !ok || zone == "" || name == "" || strings.Contains(name, "/") {
		return "", "", providers.NewError(providers.ErrNotFound, providerKind, op, "", fmt.Errorf("instance id %q: want zone/name", id))
	}
	return zone, name, nil
}

// get returns the raw instance if it carries this cluster's label.
func (p *Provider) get(ctx context.Context, op, id string) (*computepb.Instance, error) {
	zone, name, err := splitID(op, id)
	if err != nil {
		return nil, err
	}
	in, err := p.ins.Get(ctx, &computepb.GetInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name})
	if err != nil {
		return nil, mapError(op, err)
	}
	if in.GetLabels()[LabelPrefix+providers.TagCluster] != labelValue(p.cfg.Cluster) {
		return nil, providers.NewError(providers.ErrNotFound, providerKind, op, "", fmt.Errorf("instance %s not in cluster %s", id, p.cfg.Cluster))
	}
	return in, nil
}

// Get returns one instance of this cluster by "zone/name".
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	in, err := p.get(ctx, "get", id)
	if err != nil {
		return nil, err
	}
	inst := p.toInstance(in)
	return &inst, nil
}

// List returns this cluster's instances in every configured zone.
func (p *Provider) List(ctx context.Context) ([]providers.Instance, error) {
	var out []providers.Instance
	seen := map[string]bool{}
	filter := fmt.Sprintf(`labels.%s%s = "%s"`, LabelPrefix, providers.TagCluster, labelValue(p.cfg.Cluster))
	for _, mt := range p.cfg.MachineTypes {
		for _, zone := range mt.Zones {
			if seen[zone] {
				continue
			}
			seen[zone] = true
			it := p.ins.List(ctx, &computepb.ListInstancesRequest{Project: p.cfg.Project, Zone: zone, Filter: ptr(filter)})
			for {
				in, err := it.Next()
				if errors.Is(err, iterator.Done) {
					break
				}
				if err != nil {
					return nil, mapError("list", err)
				}
				out = append(out, p.toInstance(in))
			}
		}
	}
	return out, nil
}

// Delete starts deleting the instance and returns without waiting; it
// returns ErrNotFound once Compute Engine no longer has it.
func (p *Provider) Delete(ctx context.Context, id string) error {
	if _, err := p.get(ctx, "delete", id); err != nil {
		return err
	}
	zone, name, _ := splitID("delete", id)
	if _, err := p.ins.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name}); err != nil {
		err = mapError("delete", err)
		if providers.Code(err) == "resourceNotReady" {
			// Already being deleted.
			return nil
		}
		return err
	}
	return nil
}

// HostKeys reads the guest attributes under hostkeys/. Before the guest
// agent has published them it returns none and no error.
func (p *Provider) HostKeys(ctx context.Context, id string) ([]ssh.PublicKey, error) {
	if _, err := p.get(ctx, "host keys", id); err != nil {
		return nil, err
	}
	zone, name, _ := splitID("host keys", id)
	attrs, err := p.ins.GetGuestAttributes(ctx, &computepb.GetGuestAttributesInstanceRequest{
		Project: p.cfg.Project, Zone: zone, Instance: name, QueryPath: ptr("hostkeys/"),
	})
	if err != nil {
		if providers.IsNotFound(mapError("host keys", err)) {
			return nil, nil
		}
		return nil, mapError("host keys", err)
	}
	var keys []ssh.PublicKey
	for _, e := range attrs.GetQueryValue().GetItems() {
		if e.GetNamespace() != "hostkeys" {
			continue
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(e.GetKey() + " " + e.GetValue()))
		if err != nil {
			return nil, providers.NewError(providers.ErrUnavailable, providerKind, "host keys", "", fmt.Errorf("parse guest attribute hostkeys/%s: %w", e.GetKey(), err))
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func (p *Provider) toInstance(in *computepb.Instance) providers.Instance {
	zone := path.Base(in.GetZone())
	out := providers.Instance{
		ID:           zone + "/" + in.GetName(),
		Provider:     p.cfg.Name,
		Region:       p.cfg.Region,
		Zone:         zone,
		InstanceType: path.Base(in.GetMachineType()),
		Spot:         in.GetScheduling().GetProvisioningModel() == "SPOT",
		State:        stateOf(in.GetStatus()),
		SSHUser:      p.cfg.SSHUser,
	}
	if t, err := time.Parse(time.RFC3339, in.GetCreationTimestamp()); err == nil {
		out.LaunchedAt = t
	}
	for _, item := range in.GetMetadata().GetItems() {
		switch item.GetKey() {
		case metaRecord:
			out.RecordID = item.GetValue()
		case metaTags:
			var tags map[string]string
			if json.Unmarshal([]byte(item.GetValue()), &tags) == nil && len(tags) > 0 {
				out.Tags = tags
			}
		}
	}
	var host string // the first interface's address, external unless told not to
	if nics := in.GetNetworkInterfaces(); len(nics) > 0 {
		host = nics[0].GetNetworkIP()
		if !p.cfg.NoExternalIP {
			for _, ac := range nics[0].GetAccessConfigs() {
				if ac.GetNatIP() != "" {
					host = ac.GetNatIP()
				}
			}
		}
	}
	if host != "" && (out.State == providers.StateRunning || out.State == providers.StatePending) {
		out.SSHHost = net.JoinHostPort(host, strconv.Itoa(p.cfg.SSHPort))
	}
	return out
}

func stateOf(status string) providers.State {
	switch status {
	case "PROVISIONING", "STAGING":
		return providers.StatePending
	case "RUNNING":
		return providers.StateRunning
	default: // STOPPING, STOPPED, SUSPENDING, SUSPENDED, REPAIRING, TERMINATED (= stopped)
		return providers.StateStopping
	}
}

// errorCodes maps Compute Engine error reasons (synchronous errors) and
// operation error codes (asynchronous) onto error kinds.
var errorCodes = providers.CodeTable{
	// Operation errors.
	"ZONE_RESOURCE_POOL_EXHAUSTED":              providers.ErrInsufficientCapacity,
	"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": providers.ErrInsufficientCapacity,
	"REGION_RESOURCE_POOL_EXHAUSTED":            providers.ErrInsufficientCapacity,
	"QUOTA_EXCEEDED":                            providers.ErrQuotaExceeded,
	"UNSUPPORTED_OPERATION":                     providers.ErrUnsupported,
	"RESOURCE_OPERATION_RATE_EXCEEDED":          providers.ErrUnavailable,
	"RESOURCE_NOT_FOUND":                        providers.ErrInvalidRequest,
	// Error reasons of googleapi.Error.
	"notFound":                providers.ErrNotFound,
	"quotaExceeded":           providers.ErrQuotaExceeded,
	"rateLimitExceeded":       providers.ErrUnavailable,
	"userRateLimitExceeded":   providers.ErrUnavailable,
	"resourceNotReady":        providers.ErrUnavailable,
	"backendError":            providers.ErrUnavailable,
	"forbidden":               providers.ErrUnauthorized,
	"insufficientPermissions": providers.ErrUnauthorized,
	"accessNotConfigured":     providers.ErrUnauthorized,
	"authError":               providers.ErrUnauthorized,
	"required":                providers.ErrUnauthorized,
	"invalid":                 providers.ErrInvalidRequest,
	"badRequest":              providers.ErrInvalidRequest,
	"alreadyExists":           providers.ErrInvalidRequest,
}

// googleReason is the first error reason of a googleapi.Error, or "".
func googleReason(err error) string {
	var ge *googleapi.Error
	if errors.As(err, &ge) && len(ge.Errors) > 0 {
		return ge.Errors[0].Reason
	}
	return ""
}

// mapError turns a client error into a provider error by its reason; with
// no known reason it falls back on the HTTP status.
func mapError(op string, err error) error {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return providers.NewError(providers.ErrUnavailable, providerKind, op, "", err)
	}
	fallback := providers.ErrUnavailable
	switch {
	case ge.Code == http.StatusUnauthorized || ge.Code == http.StatusForbidden:
		fallback = providers.ErrUnauthorized
	case ge.Code == http.StatusNotFound:
		fallback = providers.ErrNotFound
	case ge.Code == http.StatusTooManyRequests || ge.Code >= 500:
		fallback = providers.ErrUnavailable
	case ge.Code >= 400:
		fallback = providers.ErrInvalidRequest
	}
	return errorCodes.Map(providerKind, op, googleReason(err), fallback, err)
}

func ptr[T any](v T) *T { return &v }

var _ providers.Provider = (*Provider)(nil)
