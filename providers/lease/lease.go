// Package lease rents GPU machines from a marketplace, speaking the Lambda
// Cloud API v1 (https://cloud.lambda.ai/api/v1, documented at
// https://docs-api.lambda.ai/api/cloud): GET /instance-types for types,
// prices and the regions with capacity, POST /instance-operations/launch
// and /instance-operations/terminate, GET /instances and /instances/{id},
// and GET/POST /ssh-keys to register the broker's key. Responses come as
// {"data": …}, failures as {"error": {"code", "message"}}; errors map by
// code, never by message.
//
// Idempotency: the API has no client token, so Create first looks for a
// live instance tagged with the record id (and named after it) and only
// launches when there is none. The broker calls Create for one record at a
// time, which closes the window between the look and the launch.
//
// Host keys: Lambda publishes no host keys. Rather than trust the first
// key a machine shows, the provider pins it before the machine exists: it
// derives an ed25519 host key from a secret (the broker's, from config)
// and the record id, puts the private half in the launch's cloud-init
// user data (ssh_keys), and HostKeys returns the public half. Anyone who
// can read the account's user data can read that key; they can also
// terminate the machine, so it adds no new exposure. A machine that does
// not present exactly that key is refused by the bootstrap.
package lease

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
)

// Config is one Lambda Cloud account under the broker config's
// `providers:` key.
type Config struct {
	// Name is the provider's name in offers and records; default "lambda".
	Name string `json:"name,omitempty"`
	// Cluster is the cluster tag value; List only sees machines with it.
	Cluster string `json:"cluster"`
	// Endpoint is the API's base URL; default https://cloud.lambda.ai.
	Endpoint string `json:"endpoint,omitempty"`
	// APIKeyEnv names the environment variable holding the API key;
	// default LAMBDA_API_KEY.
	APIKeyEnv string `json:"apiKeyEnv,omitempty"`
	// APIKey is the key itself, for callers that do not use the
	// environment; it is never written back out.
	APIKey string `json:"-"`
	// SSHKeyName is the name the broker's key is registered under;
	// default "spillway-<cluster>".
	SSHKeyName string `json:"sshKeyName,omitempty"`
	// HostKeySecretFile holds the secret host keys are derived from (at
	// least 32 bytes). HostKeySecret may be given instead.
	HostKeySecretFile string `json:"hostKeySecretFile,omitempty"`
	HostKeySecret     []byte `json:"-"`
	// ImageFamily is an optional image family to boot (default: Lambda
	// Stack).
	ImageFamily string `json:"imageFamily,omitempty"`
	// InstanceTypes limits the offers to these types; empty offers all.
	InstanceTypes []string `json:"instanceTypes,omitempty"`
	// Regions limits the offers to these regions; empty offers all.
	Regions []string `json:"regions,omitempty"`
	// SSHUser is the image's login user; default "ubuntu".
	SSHUser string `json:"sshUser,omitempty"`
	// SSHPort is where sshd listens; default 22.
	SSHPort int `json:"sshPort,omitempty"`
	// HTTPClient is used for API calls; default a client with a 30s
	// timeout.
	HTTPClient *http.Client `json:"-"`
}

// TagPrefix starts every tag key this provider writes ("spillway:cluster").
const TagPrefix = "spillway:"

const providerKind = "lambda"

// Provider is the Lambda Cloud provider.
type Provider struct {
	cfg    Config
	key    string
	secret []byte
	hc     *http.Client
}

// Validate checks the section as the broker config gives it (cluster
// filled in from the config's cluster); each problem is a
// *providers.ConfigError naming its field.
func (c *Config) Validate() error {
	var errs providers.ConfigErrors
	if c.Cluster == "" {
		errs.Add("cluster", "is required")
	}
	if c.SSHPort < 0 || c.SSHPort > 65535 {
		errs.Add("sshPort", "must be between 1 and 65535")
	}
	return errs.Err()
}

// New checks the config, reads the API key and the host key secret.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lambda config: %w", err)
	}
	cfg.Name = cmp.Or(cfg.Name, "lambda")
	cfg.Endpoint = cmp.Or(cfg.Endpoint, "https://cloud.lambda.ai")
	cfg.APIKeyEnv = cmp.Or(cfg.APIKeyEnv, "LAMBDA_API_KEY")
	cfg.SSHKeyName = cmp.Or(cfg.SSHKeyName, "spillway-"+cfg.Cluster)
	cfg.SSHUser = cmp.Or(cfg.SSHUser, "ubuntu")
	cfg.SSHPort = cmp.Or(cfg.SSHPort, 22)
	key := cfg.APIKey
	if key == "" {
		key = os.Getenv(cfg.APIKeyEnv)
	}
	if key == "" {
		return nil, fmt.Errorf("lambda config: no API key (set %s)", cfg.APIKeyEnv)
	}
	secret := cfg.HostKeySecret
	if len(secret) == 0 && cfg.HostKeySecretFile != "" {
		b, err := os.ReadFile(cfg.HostKeySecretFile)
		if err != nil {
			return nil, fmt.Errorf("lambda config: hostKeySecretFile: %w", err)
		}
		secret = bytes.TrimSpace(b)
	}
	if len(secret) < 32 {
		return nil, errors.New("lambda config: hostKeySecretFile: want a secret of at least 32 bytes")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Provider{cfg: cfg, key: key, secret: secret, hc: hc}, nil
}

// Name returns the configured name.
func (p *Provider) Name() string { return p.cfg.Name }

// Wire types of the API (only the fields used).

type apiError struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	Suggestion string `json:"suggestion,omitempty"`
}

type specs struct {
	VCPUs      int `json:"vcpus"`
	MemoryGiB  int `json:"memory_gib"`
	StorageGiB int `json:"storage_gib"`
	GPUs       int `json:"gpus"`
}

type instanceType struct {
	Name              string `json:"name"`
	Description       string `json:"description"`
	GPUDescription    string `json:"gpu_description"`
	PriceCentsPerHour int64  `json:"price_cents_per_hour"`
	Specs             specs  `json:"specs"`
}

type region struct {
	Name        string `json:"name"`
	Description string `json:"description"`
}

type instanceTypesItem struct {
	InstanceType instanceType `json:"instance_type"`
	Regions      []region     `json:"regions_with_capacity_available"`
}

type tag struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type instance struct {
	ID           string       `json:"id"`
	Name         string       `json:"name,omitempty"`
	IP           string       `json:"ip,omitempty"`
	PrivateIP    string       `json:"private_ip,omitempty"`
	Status       string       `json:"status"`
	SSHKeyNames  []string     `json:"ssh_key_names"`
	Region       region       `json:"region"`
	InstanceType instanceType `json:"instance_type"`
	Hostname     string       `json:"hostname,omitempty"`
	Tags         []tag        `json:"tags,omitempty"`
}

type launchRequest struct {
	RegionName       string            `json:"region_name"`
	InstanceTypeName string            `json:"instance_type_name"`
	SSHKeyNames      []string          `json:"ssh_key_names"`
	Name             string            `json:"name,omitempty"`
	Image            map[string]string `json:"image,omitempty"`
	UserData         string            `json:"user_data,omitempty"`
	Tags             []tag             `json:"tags,omitempty"`
}

type sshKey struct {
	ID        string `json:"id,omitempty"`
	Name      string `json:"name"`
	PublicKey string `json:"public_key"`
}

// call does one API request; out receives the "data" member.
func (p *Provider) call(ctx context.Context, op, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return providers.NewError(providers.ErrInvalidRequest, providerKind, op, "", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(p.cfg.Endpoint, "/")+"/api/v1"+path, body)
	if err != nil {
		return providers.NewError(providers.ErrInvalidRequest, providerKind, op, "", err)
	}
	req.Header.Set("Authorization", "Bearer "+p.key)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return providers.NewError(providers.ErrUnavailable, providerKind, op, "", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return providers.NewError(providers.ErrUnavailable, providerKind, op, "", err)
	}
	if resp.StatusCode >= 300 {
		var env struct {
			Error apiError `json:"error"`
		}
		_ = json.Unmarshal(raw, &env)
		return mapError(op, resp.StatusCode, env.Error)
	}
	env := struct {
		Data any `json:"data"`
	}{Data: out}
	if err := json.Unmarshal(raw, &env); err != nil {
		return providers.NewError(providers.ErrUnavailable, providerKind, op, "", fmt.Errorf("decode %s response: %w", path, err))
	}
	return nil
}

var gpuMemory = regexp.MustCompile(`\((\d+) GB`)

// Offers lists every instance type in every region that has capacity now.
// Lambda has no spot market; every offer is on-demand, in USD.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	var types map[string]instanceTypesItem
	if err := p.call(ctx, "offers", http.MethodGet, "/instance-types", nil, &types); err != nil {
		return nil, err
	}
	var out []providers.Offer
	for name, item := range types {
		if len(p.cfg.InstanceTypes) > 0 && !contains(p.cfg.InstanceTypes, name) {
			continue
		}
		it := item.InstanceType
		model, mem := gpuModel(it.GPUDescription)
		for _, r := range item.Regions {
			if len(p.cfg.Regions) > 0 && !contains(p.cfg.Regions, r.Name) {
				continue
			}
			out = append(out, providers.Offer{
				Provider: p.cfg.Name, Region: r.Name, InstanceType: name,
				GPUModel: model, GPUs: it.Specs.GPUs, GPUMemoryBytes: mem,
				CPUs: it.Specs.VCPUs, MemoryBytes: int64(it.Specs.MemoryGiB) << 30,
				PricePerHour: billing.Amount(it.PriceCentsPerHour * (billing.MicrosPerUnit / 100)),
				Currency:     "USD", Available: true, PriceSource: providers.PriceFromAPI,
			})
		}
	}
	providers.SortOffers(out)
	return out, nil
}

// gpuModel reads "H100 (80 GB SXM5)" as model "H100" and 80 GiB per GPU.
func gpuModel(desc string) (string, int64) {
	model, _, _ := strings.Cut(desc, " ")
	var mem int64
	if m := gpuMemory.FindStringSubmatch(desc); m != nil {
		gb, _ := strconv.ParseInt(m[1], 10, 64)
		mem = gb << 30
	}
	return model, mem
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// instanceName is the Lambda instance name for a record.
func instanceName(recordID string) string { return "spillway-" + recordID }

// Create launches one instance, or returns the live one already tagged
// with the record id.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (*providers.Instance, error) {
	if err := req.Validate(); err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	if req.Offer.Region == "" || req.Offer.Spot {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", errors.New("offer: want an on-demand offer with a region"))
	}
	existing, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, in := range existing {
		if in.RecordID == req.RecordID && in.State != providers.StateStopping {
			return &in, nil
		}
	}
	if err := p.ensureSSHKey(ctx, req.SSHAuthorizedKey); err != nil {
		return nil, err
	}
	signer, err := HostKey(p.secret, req.RecordID)
	if err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	priv, err := hostKeyPEM(p.secret, req.RecordID)
	if err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	none := []string{}
	cc := providers.CloudConfig{
		SSHKeys: map[string]string{
			"ed25519_private": priv,
			"ed25519_public":  strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))),
		},
		SSHGenKeyTypes: &none,
	}
	if req.SSHAuthorizedKey != "" {
		cc.SSHAuthorizedKeys = []string{req.SSHAuthorizedKey}
	}
	userData, err := providers.UserData(cc, req.UserData)
	if err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", err)
	}
	var tags []tag
	for k, v := range providers.EncodeTags(TagPrefix, p.cfg.Cluster, req.RecordID, req.Tags) {
		tags = append(tags, tag{Key: k, Value: v})
	}
	launch := launchRequest{
		RegionName: req.Offer.Region, InstanceTypeName: req.Offer.InstanceType,
		SSHKeyNames: []string{p.cfg.SSHKeyName}, Name: instanceName(req.RecordID),
		UserData: userData, Tags: tags,
	}
	if p.cfg.ImageFamily != "" {
		launch.Image = map[string]string{"family": p.cfg.ImageFamily}
	}
	var out struct {
		InstanceIDs []string `json:"instance_ids"`
	}
	if err := p.call(ctx, "create", http.MethodPost, "/instance-operations/launch", launch, &out); err != nil {
		// On launch, a missing object is the key, type or region asked
		// for: the request is wrong, not the machine gone.
		if providers.IsNotFound(err) {
			return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "create", providers.Code(err), err)
		}
		return nil, err
	}
	if len(out.InstanceIDs) != 1 {
		return nil, providers.NewError(providers.ErrUnavailable, providerKind, "create", "", fmt.Errorf("launch returned %d instance ids, want 1", len(out.InstanceIDs)))
	}
	return p.Get(ctx, out.InstanceIDs[0])
}

// ensureSSHKey registers the broker's key under SSHKeyName unless it is
// already there. A key of that name with other contents is an error.
func (p *Provider) ensureSSHKey(ctx context.Context, authorized string) error {
	want, _, _, _, err := ssh.ParseAuthorizedKey([]byte(authorized))
	if err != nil {
		return providers.NewError(providers.ErrInvalidRequest, providerKind, "create", "", fmt.Errorf("sshAuthorizedKey: Lambda needs the broker's key: %w", err))
	}
	var keys []sshKey
	if err := p.call(ctx, "ssh keys", http.MethodGet, "/ssh-keys", nil, &keys); err != nil {
		return err
	}
	for _, k := range keys {
		if k.Name != p.cfg.SSHKeyName {
			continue
		}
		have, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k.PublicKey))
		if err != nil || !bytes.Equal(have.Marshal(), want.Marshal()) {
			return providers.NewError(providers.ErrInvalidRequest, providerKind, "ssh keys", "",
				fmt.Errorf("ssh key %q is registered with another public key", p.cfg.SSHKeyName))
		}
		return nil
	}
	return p.call(ctx, "ssh keys", http.MethodPost, "/ssh-keys", sshKey{Name: p.cfg.SSHKeyName, PublicKey: strings.TrimSpace(authorized)}, &sshKey{})
}

// get returns the raw instance if it carries this cluster's tag.
func (p *Provider) get(ctx context.Context, op, id string) (instance, error) {
	var in instance
	if id == "" || strings.ContainsAny(id, "/?#") {
		return in, providers.NewError(providers.ErrNotFound, providerKind, op, "", fmt.Errorf("instance id %q", id))
	}
	if err := p.call(ctx, op, http.MethodGet, "/instances/"+id, nil, &in); err != nil {
		return in, err
	}
	if tagOf(in.Tags, TagPrefix+providers.TagCluster) != p.cfg.Cluster {
		return in, providers.NewError(providers.ErrNotFound, providerKind, op, "", fmt.Errorf("instance %s not in cluster %s", id, p.cfg.Cluster))
	}
	return in, nil
}

// Get returns one instance of this cluster.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	in, err := p.get(ctx, "get", id)
	if err != nil {
		return nil, err
	}
	out := p.toInstance(in)
	return &out, nil
}

// List returns this cluster's instances that are not terminated.
func (p *Provider) List(ctx context.Context) ([]providers.Instance, error) {
	var all []instance
	if err := p.call(ctx, "list", http.MethodGet, "/instances", nil, &all); err != nil {
		return nil, err
	}
	var out []providers.Instance
	for _, in := range all {
		if tagOf(in.Tags, TagPrefix+providers.TagCluster) != p.cfg.Cluster {
			continue
		}
		if inst := p.toInstance(in); inst.State != providers.StateTerminated {
			out = append(out, inst)
		}
	}
	return out, nil
}

// Delete terminates the instance; while it is terminating Delete returns
// nil, and ErrNotFound once it is gone or terminated.
func (p *Provider) Delete(ctx context.Context, id string) error {
	in, err := p.get(ctx, "delete", id)
	if err != nil {
		return err
	}
	switch stateOf(in.Status) {
	case providers.StateTerminated:
		return providers.NewError(providers.ErrNotFound, providerKind, "delete", "", fmt.Errorf("instance %s is %s", id, in.Status))
	case providers.StateStopping:
		return nil
	}
	body := map[string][]string{"instance_ids": {id}}
	return p.call(ctx, "delete", http.MethodPost, "/instance-operations/terminate", body, &struct{}{})
}

// HostKeys returns the host key pinned for the instance's record at launch.
func (p *Provider) HostKeys(ctx context.Context, id string) ([]ssh.PublicKey, error) {
	in, err := p.get(ctx, "host keys", id)
	if err != nil {
		return nil, err
	}
	record := tagOf(in.Tags, TagPrefix+providers.TagRecord)
	if record == "" {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "host keys", "", fmt.Errorf("instance %s has no record tag", id))
	}
	s, err := HostKey(p.secret, record)
	if err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, providerKind, "host keys", "", err)
	}
	return []ssh.PublicKey{s.PublicKey()}, nil
}

// hostKeySeed is HMAC-SHA256(secret, record id): the ed25519 seed of the
// record's host key.
func hostKeySeed(secret []byte, recordID string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("spillway host key v1\x00" + recordID))
	return m.Sum(nil)
}

// HostKey is the host key pinned for a record: the same secret and record
// id always give the same key, so it survives a broker restart without
// being stored.
func HostKey(secret []byte, recordID string) (ssh.Signer, error) {
	return ssh.NewSignerFromKey(ed25519.NewKeyFromSeed(hostKeySeed(secret, recordID)))
}

func hostKeyPEM(secret []byte, recordID string) (string, error) {
	block, err := ssh.MarshalPrivateKey(ed25519.NewKeyFromSeed(hostKeySeed(secret, recordID)), "")
	if err != nil {
		return "", fmt.Errorf("encode host key: %w", err)
	}
	return string(pem.EncodeToMemory(block)), nil
}

func (p *Provider) toInstance(in instance) providers.Instance {
	raw := map[string]string{}
	for _, t := range in.Tags {
		raw[t.Key] = t.Value
	}
	_, record, tags := providers.DecodeTags(TagPrefix, raw)
	out := providers.Instance{
		ID: in.ID, RecordID: record, Provider: p.cfg.Name, Region: in.Region.Name,
		InstanceType: in.InstanceType.Name, State: stateOf(in.Status), SSHUser: p.cfg.SSHUser, Tags: tags,
	}
	if in.IP != "" && (out.State == providers.StateRunning || out.State == providers.StatePending) {
		out.SSHHost = net.JoinHostPort(in.IP, strconv.Itoa(p.cfg.SSHPort))
	}
	return out
}

func stateOf(status string) providers.State {
	switch status {
	case "active":
		return providers.StateRunning
	case "terminating":
		return providers.StateStopping
	case "terminated", "preempted":
		return providers.StateTerminated
	default: // booting, unhealthy
		return providers.StatePending
	}
}

func tagOf(tags []tag, key string) string {
	for _, t := range tags {
		if t.Key == key {
			return t.Value
		}
	}
	return ""
}

// errorCodes maps Lambda Cloud error codes onto error kinds.
var errorCodes = providers.CodeTable{
	"instance-operations/launch/insufficient-capacity":       providers.ErrInsufficientCapacity,
	"global/quota-exceeded":                                  providers.ErrQuotaExceeded,
	"global/invalid-api-key":                                 providers.ErrUnauthorized,
	"global/account-inactive":                                providers.ErrUnauthorized,
	"global/invalid-address":                                 providers.ErrUnauthorized,
	"global/object-does-not-exist":                           providers.ErrNotFound,
	"global/invalid-parameters":                              providers.ErrInvalidRequest,
	"global/duplicate":                                       providers.ErrInvalidRequest,
	"instance-operations/launch/file-system-in-wrong-region": providers.ErrInvalidRequest,
}

// providerErrorPrefix marks errors from Lambda's upstream providers
// (outages, exhaustion), which the API documents by this code prefix.
const providerErrorPrefix = "provider/"

func mapError(op string, status int, e apiError) error {
	fallback := providers.ErrUnavailable
	switch {
	case strings.HasPrefix(e.Code, providerErrorPrefix):
		fallback = providers.ErrUnavailable
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		fallback = providers.ErrUnauthorized
	case status == http.StatusNotFound:
		fallback = providers.ErrNotFound
	case status == http.StatusTooManyRequests || status >= 500:
		fallback = providers.ErrUnavailable
	case status >= 400:
		fallback = providers.ErrInvalidRequest
	}
	var cause error
	if e.Message != "" {
		cause = errors.New(e.Message)
	}
	return errorCodes.Map(providerKind, op, e.Code, fallback, cause)
}

var _ providers.Provider = (*Provider)(nil)
