// Package aws is the EC2 provider, on aws-sdk-go-v2's service/ec2.
//
// One Provider serves one account and region. Machines are launched with
// RunInstances (ClientToken = the broker's record id, so a retried create
// never launches twice), tagged with the cluster, the record id and the
// request's tags, found again with DescribeInstances filtered on the
// cluster tag, and ended with TerminateInstances. SSH host keys are read
// from the console output, where cloud-init prints them on first boot.
//
// Offers come from configuration (instance types with their GPUs and
// prices per region): prices are a business decision the operator owns.
// On top of it, spot prices may come live from DescribeSpotPriceHistory
// (liveSpotPrices), and on-demand prices from the AWS Price List Query
// API when an operator refreshes them (FetchPrices, pricing.go; the
// broker keeps the table and hands it back with UsePrices).
// Credentials come from the SDK's default chain (environment, shared
// config, SSO, instance role).
package aws

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/pricing"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
)

// API is the part of the EC2 client this package uses; *ec2.Client
// implements it.
type API interface {
	RunInstances(ctx context.Context, in *ec2.RunInstancesInput, optFns ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, optFns ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, optFns ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	GetConsoleOutput(ctx context.Context, in *ec2.GetConsoleOutputInput, optFns ...func(*ec2.Options)) (*ec2.GetConsoleOutputOutput, error)
	CreatePlacementGroup(ctx context.Context, in *ec2.CreatePlacementGroupInput, optFns ...func(*ec2.Options)) (*ec2.CreatePlacementGroupOutput, error)
	DeletePlacementGroup(ctx context.Context, in *ec2.DeletePlacementGroupInput, optFns ...func(*ec2.Options)) (*ec2.DeletePlacementGroupOutput, error)
	DescribeSpotPriceHistory(ctx context.Context, in *ec2.DescribeSpotPriceHistoryInput, optFns ...func(*ec2.Options)) (*ec2.DescribeSpotPriceHistoryOutput, error)
}

// Config is one EC2 provider under the broker config's `providers:` key.
type Config struct {
	// Name is the provider's name in offers and records; default
	// "aws-<region>".
	Name string `json:"name,omitempty"`
	// Cluster is the cluster tag value; List only sees machines with it.
	Cluster string `json:"cluster"`
	Region  string `json:"region"`
	// Endpoint overrides the EC2 endpoint (a VPC endpoint, a test server).
	Endpoint string `json:"endpoint,omitempty"`
	// ImageID is the AMI to launch (a GPU image with cloud-init).
	ImageID string `json:"imageId"`
	// SubnetIDs maps an availability zone to the subnet to launch into;
	// the key "" is used for offers without a zone.
	SubnetIDs        map[string]string `json:"subnetIds,omitempty"`
	SecurityGroupIDs []string          `json:"securityGroupIds,omitempty"`
	// KeyName is an optional EC2 key pair; the broker's key is installed
	// through user data either way.
	KeyName string `json:"keyName,omitempty"`
	// InstanceProfile is an optional IAM instance profile name.
	InstanceProfile string `json:"instanceProfile,omitempty"`
	// SSHUser is the image's login user; default "ubuntu".
	SSHUser string `json:"sshUser,omitempty"`
	// SSHPort is where sshd listens; default 22.
	SSHPort int `json:"sshPort,omitempty"`
	// UsePrivateIP connects to the private address (broker inside the VPC).
	UsePrivateIP bool `json:"usePrivateIp,omitempty"`
	// Currency of the prices; default "USD".
	Currency string `json:"currency,omitempty"`
	// InstanceTypes are what this provider offers.
	InstanceTypes []InstanceType `json:"instanceTypes"`
	// MetadataEndpoint is the instance metadata server the agent on a
	// spot machine reads interruption notices from; default
	// http://169.254.169.254 (set it for a proxy, or a mock in tests).
	MetadataEndpoint string `json:"metadataEndpoint,omitempty"`
	// LiveSpotPrices prices spot offers from DescribeSpotPriceHistory
	// (the newest Linux/UNIX price per type and zone; the cheapest zone
	// for an offer without one) instead of each type's spotPrice, which
	// stays the fallback when EC2 has no price for it.
	LiveSpotPrices bool `json:"liveSpotPrices,omitempty"`
	// PricingEndpoint overrides the AWS Price List Query API endpoint
	// (default https://api.pricing.<pricingRegion>.amazonaws.com; a test
	// server). `spillway offers refresh` reads on-demand prices there.
	PricingEndpoint string `json:"pricingEndpoint,omitempty"`
	// PricingRegion is the region the Price List Query API is called in:
	// us-east-1 (default), eu-central-1 or ap-south-1; the prices read
	// are those of Region either way.
	PricingRegion string `json:"pricingRegion,omitempty"`
}

// InstanceType is one EC2 instance type on offer, with its prices.
type InstanceType struct {
	// Name is the EC2 type, e.g. "p5.48xlarge".
	Name string `json:"name"`
	// GPUModel is the short normalised model: "H100", "A10G", "L4".
	GPUModel     string `json:"gpuModel"`
	GPUs         int    `json:"gpus"`
	GPUMemoryGiB int    `json:"gpuMemoryGiB"`
	CPUs         int    `json:"cpus"`
	MemoryGiB    int    `json:"memoryGiB"`
	// Zones lists availability zones to offer it in; empty offers it
	// region-wide and lets EC2 pick.
	Zones []string `json:"zones,omitempty"`
	// OnDemandPrice per hour; zero offers no on-demand market.
	OnDemandPrice billing.Amount `json:"onDemandPrice,omitempty"`
	// SpotPrice per hour, as the operator expects to pay; zero offers no
	// spot market.
	SpotPrice billing.Amount `json:"spotPrice,omitempty"`
}

// TagPrefix starts every tag key this provider writes ("spillway:cluster").
const TagPrefix = "spillway:"

const providerKind = "aws"

// Provider is the EC2 provider.
type Provider struct {
	cfg     Config
	api     API
	pricing PricingAPI // nil: FetchPrices is unsupported

	mu     sync.Mutex
	prices *providers.PriceTable // the refreshed on-demand prices (UsePrices)
}

// New builds a provider with credentials from the SDK's default chain.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(cfg.Region))
	if err != nil {
		return nil, fmt.Errorf("load aws config: %w", err)
	}
	client := ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = awssdk.String(cfg.Endpoint)
		}
	})
	prices := pricing.NewFromConfig(awsCfg, func(o *pricing.Options) {
		o.Region = cfg.PricingRegion
		if cfg.PricingEndpoint != "" {
			o.BaseEndpoint = awssdk.String(cfg.PricingEndpoint)
		}
	})
	return &Provider{cfg: cfg, api: client, pricing: prices}, nil
}

// NewWithAPI builds a provider on given clients; prices may be nil (no
// price list: FetchPrices fails with ErrUnsupported).
func NewWithAPI(cfg Config, api API, prices PricingAPI) (*Provider, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Provider{cfg: cfg, api: api, pricing: prices}, nil
}

// Validate checks the section as the broker config gives it (cluster
// filled in from the config's cluster); each problem is a
// *providers.ConfigError naming its field.
func (c *Config) Validate() error {
	var errs providers.ConfigErrors
	if c.Cluster == "" {
		errs.Add("cluster", "is required")
	}
	if c.Region == "" {
		errs.Add("region", "is required, e.g. us-east-1")
	}
	if c.ImageID == "" {
		errs.Add("imageId", "is required (a GPU AMI with cloud-init)")
	}
	if len(c.InstanceTypes) == 0 {
		errs.Add("instanceTypes", "needs at least one instance type")
	}
	for i, it := range c.InstanceTypes {
		if it.Name == "" || it.GPUs < 0 || (it.OnDemandPrice <= 0 && it.SpotPrice <= 0) {
			errs.Add(fmt.Sprintf("instanceTypes[%d]", i), "want a name, gpus >= 0 and an onDemandPrice or spotPrice above 0")
		}
	}
	switch c.PricingRegion {
	case "", "us-east-1", "eu-central-1", "ap-south-1":
	default:
		errs.Add("pricingRegion", "%q: the Price List Query API is served in us-east-1, eu-central-1 and ap-south-1 only", c.PricingRegion)
	}
	return errs.Err()
}

func (c *Config) defaults() error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("aws config: %w", err)
	}
	c.Name = cmp.Or(c.Name, "aws-"+c.Region)
	c.SSHUser = cmp.Or(c.SSHUser, "ubuntu")
	c.SSHPort = cmp.Or(c.SSHPort, 22)
	c.Currency = cmp.Or(c.Currency, "USD")
	c.PricingRegion = cmp.Or(c.PricingRegion, DefaultPricingRegion)
	return nil
}

// Name returns the configured name.
func (p *Provider) Name() string { return p.cfg.Name }

// Offers lists each configured type in each zone, on-demand and spot where
// a price is set. On-demand offers carry the refreshed price list's price
// where UsePrices gave one, spot offers the spot history's with
// liveSpotPrices; each says which (PriceSource). EC2 has no capacity API,
// so every offer is Available; a launch that finds none fails with
// ErrInsufficientCapacity.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	var live map[string]spotPrice
	if p.cfg.LiveSpotPrices {
		var err error
		if live, err = p.spotPrices(ctx); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	table := p.prices
	p.mu.Unlock()
	var out []providers.Offer
	for _, it := range p.cfg.InstanceTypes {
		zones := it.Zones
		if len(zones) == 0 {
			zones = []string{""}
		}
		for _, z := range zones {
			base := providers.Offer{
				Provider: p.cfg.Name, Region: p.cfg.Region, Zone: z, InstanceType: it.Name,
				GPUModel: it.GPUModel, GPUs: it.GPUs, GPUMemoryBytes: int64(it.GPUMemoryGiB) << 30,
				CPUs: it.CPUs, MemoryBytes: int64(it.MemoryGiB) << 30,
				Currency: p.cfg.Currency, Available: true,
			}
			if it.OnDemandPrice > 0 {
				o := base
				o.PricePerHour, o.PriceSource = it.OnDemandPrice, providers.PriceFromConfig
				if v, ok := tablePrice(table, it.Name); ok {
					o.PricePerHour, o.PriceSource, o.PricedAt = v, providers.PriceFromPriceList, table.FetchedAt
				}
				out = append(out, o)
			}
			if it.SpotPrice > 0 || live[it.Name+"/"+z].price > 0 {
				o := base
				o.Spot, o.PricePerHour, o.PriceSource = true, it.SpotPrice, providers.PriceFromConfig
				if v, ok := live[it.Name+"/"+z]; ok {
					o.PricePerHour, o.PriceSource, o.PricedAt = v.price, providers.PriceFromSpotHistory, v.at
				}
				out = append(out, o)
			}
		}
	}
	return out, nil
}

// Create launches one instance, idempotently on the record id (EC2's
// ClientToken).
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (*providers.Instance, error) {
	if err := req.Validate(); err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	offers, _ := p.Offers(ctx)
	offer, ok := providers.FindOffer(offers, req.Offer)
	if !ok {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", fmt.Errorf("no offer %s", req.Offer.Key()))
	}
	cc := providers.CloudConfig{}
	if req.SSHAuthorizedKey != "" {
		cc.SSHAuthorizedKeys = []string{req.SSHAuthorizedKey}
	}
	userData, err := providers.UserData(cc, req.UserData)
	if err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	tags := providers.EncodeTags(TagPrefix, p.cfg.Cluster, req.RecordID, req.Tags)
	tags["Name"] = "spillway-" + req.RecordID
	in := &ec2.RunInstancesInput{
		ClientToken:       awssdk.String(req.RecordID),
		ImageId:           awssdk.String(p.cfg.ImageID),
		InstanceType:      types.InstanceType(offer.InstanceType),
		MinCount:          awssdk.Int32(1),
		MaxCount:          awssdk.Int32(1),
		UserData:          awssdk.String(base64.StdEncoding.EncodeToString([]byte(userData))),
		SecurityGroupIds:  p.cfg.SecurityGroupIDs,
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: ec2Tags(tags)}},
	}
	if offer.Zone != "" {
		in.Placement = &types.Placement{AvailabilityZone: awssdk.String(offer.Zone)}
	}
	if req.Placement != "" {
		if err := p.ensurePlacementGroup(ctx, req.Placement); err != nil {
			return nil, err
		}
		if in.Placement == nil {
			in.Placement = &types.Placement{}
		}
		in.Placement.GroupName = awssdk.String(req.Placement)
	}
	if s := p.cfg.SubnetIDs[offer.Zone]; s != "" {
		in.SubnetId = awssdk.String(s)
	}
	if p.cfg.KeyName != "" {
		in.KeyName = awssdk.String(p.cfg.KeyName)
	}
	if p.cfg.InstanceProfile != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: awssdk.String(p.cfg.InstanceProfile)}
	}
	if offer.Spot {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{
			MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{
				SpotInstanceType:             types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate,
			},
		}
	}
	out, err := p.api.RunInstances(ctx, in)
	if err != nil {
		return nil, mapError("create", err)
	}
	if len(out.Instances) != 1 {
		return nil, providers.NewError(providers.ErrUnavailable, providerKind, "create", "", fmt.Errorf("RunInstances returned %d instances, want 1", len(out.Instances)))
	}
	inst := p.toInstance(out.Instances[0])
	return &inst, nil
}

// describe returns the instance with id if it carries this cluster's tag.
func (p *Provider) describe(ctx context.Context, op, id string) (types.Instance, error) {
	out, err := p.api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return types.Instance{}, mapError(op, err)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if awssdk.ToString(in.InstanceId) == id && tagValue(in.Tags, TagPrefix+providers.TagCluster) == p.cfg.Cluster {
				return in, nil
			}
		}
	}
	return types.Instance{}, providers.NewError(providers.ErrNotFound, providerKind, op, "", fmt.Errorf("instance %s not in cluster %s", id, p.cfg.Cluster))
}

// Get returns one instance of this cluster; a terminated one is returned
// with StateTerminated while EC2 still lists it.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	in, err := p.describe(ctx, "get", id)
	if err != nil {
		return nil, err
	}
	inst := p.toInstance(in)
	return &inst, nil
}

// liveStates are the states List asks for: everything but terminated.
var liveStates = []string{"pending", "running", "shutting-down", "stopping", "stopped"}

// List returns this cluster's instances that are not terminated.
func (p *Provider) List(ctx context.Context) ([]providers.Instance, error) {
	in := &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: awssdk.String("tag:" + TagPrefix + providers.TagCluster), Values: []string{p.cfg.Cluster}},
		{Name: awssdk.String("instance-state-name"), Values: liveStates},
	}}
	var out []providers.Instance
	pages := ec2.NewDescribeInstancesPaginator(p.api, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, mapError("list", err)
		}
		for _, r := range page.Reservations {
			for _, i := range r.Instances {
				out = append(out, p.toInstance(i))
			}
		}
	}
	return out, nil
}

// Delete terminates the instance. It returns ErrNotFound once EC2 reports
// it terminated (or no longer knows it).
func (p *Provider) Delete(ctx context.Context, id string) error {
	in, err := p.describe(ctx, "delete", id)
	if err != nil {
		return err
	}
	if in.State != nil && in.State.Name == types.InstanceStateNameTerminated {
		return providers.NewError(providers.ErrNotFound, providerKind, "delete", "", fmt.Errorf("instance %s is terminated", id))
	}
	if _, err := p.api.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
		return mapError("delete", err)
	}
	return nil
}

// HostKeys reads the host keys cloud-init printed to the console. Before
// the machine has printed them it returns none and no error.
func (p *Provider) HostKeys(ctx context.Context, id string) ([]ssh.PublicKey, error) {
	if _, err := p.describe(ctx, "host keys", id); err != nil {
		return nil, err
	}
	out, err := p.api.GetConsoleOutput(ctx, &ec2.GetConsoleOutputInput{InstanceId: awssdk.String(id), Latest: awssdk.Bool(true)})
	if err != nil && providers.Code(mapError("host keys", err)) == "UnsupportedOperation" {
		// Latest output needs a Nitro instance; older types have the
		// buffered output only.
		out, err = p.api.GetConsoleOutput(ctx, &ec2.GetConsoleOutputInput{InstanceId: awssdk.String(id)})
	}
	if err != nil {
		return nil, mapError("host keys", err)
	}
	raw, err := base64.StdEncoding.DecodeString(awssdk.ToString(out.Output))
	if err != nil {
		return nil, providers.NewError(providers.ErrUnavailable, providerKind, "host keys", "", fmt.Errorf("decode console output: %w", err))
	}
	return providers.ParseConsoleHostKeys(string(raw)), nil
}

func (p *Provider) toInstance(in types.Instance) providers.Instance {
	raw := map[string]string{}
	for _, t := range in.Tags {
		raw[awssdk.ToString(t.Key)] = awssdk.ToString(t.Value)
	}
	_, record, tags := providers.DecodeTags(TagPrefix, raw)
	out := providers.Instance{
		ID:           awssdk.ToString(in.InstanceId),
		RecordID:     record,
		Provider:     p.cfg.Name,
		Region:       p.cfg.Region,
		InstanceType: string(in.InstanceType),
		Spot:         in.InstanceLifecycle == types.InstanceLifecycleTypeSpot,
		State:        providers.StatePending,
		SSHUser:      p.cfg.SSHUser,
		LaunchedAt:   awssdk.ToTime(in.LaunchTime),
		Tags:         tags,
	}
	if in.Placement != nil {
		out.Zone = awssdk.ToString(in.Placement.AvailabilityZone)
	}
	if in.State != nil {
		out.State = stateOf(in.State.Name)
	}
	host := awssdk.ToString(in.PublicIpAddress)
	if p.cfg.UsePrivateIP || host == "" {
		host = awssdk.ToString(in.PrivateIpAddress)
	}
	if host != "" && (out.State == providers.StateRunning || out.State == providers.StatePending) {
		out.SSHHost = net.JoinHostPort(host, strconv.Itoa(p.cfg.SSHPort))
	}
	return out
}

func stateOf(s types.InstanceStateName) providers.State {
	switch s {
	case types.InstanceStateNamePending:
		return providers.StatePending
	case types.InstanceStateNameRunning:
		return providers.StateRunning
	case types.InstanceStateNameTerminated:
		return providers.StateTerminated
	default: // shutting-down, stopping, stopped
		return providers.StateStopping
	}
}

func ec2Tags(m map[string]string) []types.Tag {
	out := make([]types.Tag, 0, len(m))
	for k, v := range m {
		out = append(out, types.Tag{Key: awssdk.String(k), Value: awssdk.String(v)})
	}
	return out
}

func tagValue(tags []types.Tag, key string) string {
	for _, t := range tags {
		if awssdk.ToString(t.Key) == key {
			return awssdk.ToString(t.Value)
		}
	}
	return ""
}

// errorCodes maps EC2 API error codes to error kinds, in the manner of
// karpenter-provider-aws pkg/errors.
var errorCodes = providers.CodeTable{
	"InsufficientInstanceCapacity":         providers.ErrInsufficientCapacity,
	"InsufficientHostCapacity":             providers.ErrInsufficientCapacity,
	"InsufficientReservedInstanceCapacity": providers.ErrInsufficientCapacity,
	"InsufficientFreeAddressesInSubnet":    providers.ErrInsufficientCapacity,
	"InstanceLimitExceeded":                providers.ErrQuotaExceeded,
	"VcpuLimitExceeded":                    providers.ErrQuotaExceeded,
	"MaxSpotInstanceCountExceeded":         providers.ErrQuotaExceeded,
	"SpotMaxPriceTooLow":                   providers.ErrUnsupported,
	"Unsupported":                          providers.ErrUnsupported,
	"UnsupportedOperation":                 providers.ErrUnsupported,
	"InvalidInstanceID.NotFound":           providers.ErrNotFound,
	"AuthFailure":                          providers.ErrUnauthorized,
	"UnauthorizedOperation":                providers.ErrUnauthorized,
	"OptInRequired":                        providers.ErrUnauthorized,
	"Blocked":                              providers.ErrUnauthorized,
	"RequestLimitExceeded":                 providers.ErrUnavailable,
	"InternalError":                        providers.ErrUnavailable,
	"Unavailable":                          providers.ErrUnavailable,
	"InvalidInstanceID.Malformed":          providers.ErrInvalidRequest,
	"IdempotentParameterMismatch":          providers.ErrInvalidRequest,
	"InvalidParameterValue":                providers.ErrInvalidRequest,
	"InvalidParameterCombination":          providers.ErrInvalidRequest,
	"MissingParameter":                     providers.ErrInvalidRequest,
	"InvalidAMIID.NotFound":                providers.ErrInvalidRequest,
	"InvalidSubnetID.NotFound":             providers.ErrInvalidRequest,
	// The Price List Query API's.
	"AccessDeniedException":     providers.ErrUnauthorized,
	"ThrottlingException":       providers.ErrUnavailable,
	"InternalErrorException":    providers.ErrUnavailable,
	"InvalidParameterException": providers.ErrInvalidRequest,
	"InvalidNextTokenException": providers.ErrInvalidRequest,
	"ExpiredNextTokenException": providers.ErrInvalidRequest,
}

// mapError turns an SDK error into a provider error by its API code; an
// unknown code falls back on the HTTP status (4xx invalid, else
// unavailable), and a transport failure is unavailable.
func mapError(op string, err error) error {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return providers.NewError(providers.ErrUnavailable, providerKind, op, "", err)
	}
	fallback := providers.ErrUnavailable
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &respErr) && respErr.HTTPStatusCode() >= 400 && respErr.HTTPStatusCode() < 500 {
		fallback = providers.ErrInvalidRequest
	}
	return errorCodes.Map(providerKind, op, apiErr.ErrorCode(), fallback, err)
}

var _ providers.PriceRefresher = (*Provider)(nil)

// spotPrice is one spot price and when EC2 set it.
type spotPrice struct {
	price billing.Amount
	at    time.Time
}

// spotPrices reads the newest spot price of every configured type in
// every zone ("type/zone"), and the cheapest zone's under "type/".
func (p *Provider) spotPrices(ctx context.Context) (map[string]spotPrice, error) {
	var types_ []types.InstanceType
	for _, it := range p.cfg.InstanceTypes {
		types_ = append(types_, types.InstanceType(it.Name))
	}
	in := &ec2.DescribeSpotPriceHistoryInput{InstanceTypes: types_, ProductDescriptions: []string{"Linux/UNIX"},
		StartTime: awssdk.Time(time.Now())}
	out := map[string]spotPrice{}
	for {
		resp, err := p.api.DescribeSpotPriceHistory(ctx, in)
		if err != nil {
			return nil, mapError("describe spot price history", err)
		}
		for _, sp := range resp.SpotPriceHistory {
			price, err := billing.ParseAmount(awssdk.ToString(sp.SpotPrice))
			if err != nil {
				return nil, fmt.Errorf("describe spot price history: %s in %s: price %q: %w", sp.InstanceType, awssdk.ToString(sp.AvailabilityZone), awssdk.ToString(sp.SpotPrice), err)
			}
			key := string(sp.InstanceType) + "/" + awssdk.ToString(sp.AvailabilityZone)
			at := awssdk.ToTime(sp.Timestamp)
			if old, ok := out[key]; ok && !at.After(old.at) {
				continue
			}
			out[key] = spotPrice{price: price, at: at}
		}
		if awssdk.ToString(resp.NextToken) == "" {
			break
		}
		in.NextToken = resp.NextToken
	}
	for key, v := range maps.Clone(out) {
		typ, _, _ := strings.Cut(key, "/")
		if old, ok := out[typ+"/"]; !ok || v.price < old.price || (v.price == old.price && v.at.After(old.at)) {
			out[typ+"/"] = v
		}
	}
	return out, nil
}
