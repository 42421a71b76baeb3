package providers

import (
	"errors"
	"fmt"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
	"sigs.k8s.io/yaml"

	"github.com/spillway-dev/spillway/billing"
)

const edKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl broker"

func TestErrorKindsSurviveWrapping(t *testing.T) {
	table := CodeTable{"InsufficientInstanceCapacity": ErrInsufficientCapacity, "VcpuLimitExceeded": ErrQuotaExceeded}
	cause := errors.New("api said no")
	err := fmt.Errorf("create instance: %w", table.Map("aws", "create", "VcpuLimitExceeded", ErrUnavailable, cause))
	if !IsQuotaExceeded(err) || !IsNextOffer(err) || IsInsufficientCapacity(err) {
		t.Errorf("kind lost or wrong: %v", err)
	}
	if !errors.Is(err, cause) {
		t.Error("cause lost")
	}
	if Code(err) != "VcpuLimitExceeded" {
		t.Errorf("Code = %q", Code(err))
	}
	unknown := table.Map("aws", "create", "SomethingNew", ErrUnavailable, nil)
	if !errors.Is(unknown, ErrUnavailable) || IsNextOffer(unknown) {
		t.Errorf("unknown code: %v, want the fallback kind", unknown)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	good := CreateRequest{RecordID: "01HZX3", Offer: Offer{InstanceType: "p5.48xlarge"}, Tags: map[string]string{"team": "nlp"}, SSHAuthorizedKey: edKey}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	for field, mutate := range map[string]func(*CreateRequest){
		"recordId":         func(r *CreateRequest) { r.RecordID = "bad id with spaces" },
		"offer":            func(r *CreateRequest) { r.Offer.InstanceType = "" },
		"tags.Team":        func(r *CreateRequest) { r.Tags = map[string]string{"Team": "x"} },
		"tags.cluster":     func(r *CreateRequest) { r.Tags = map[string]string{"cluster": "x"} },
		"tags.job":         func(r *CreateRequest) { r.Tags = map[string]string{"job": strings.Repeat("x", 64)} },
		"sshAuthorizedKey": func(r *CreateRequest) { r.SSHAuthorizedKey = "not a key" },
	} {
		r := good
		mutate(&r)
		err := r.Validate()
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want ErrInvalidRequest naming the field", field, err)
		}
	}
}

func TestTagsRoundTrip(t *testing.T) {
	raw := EncodeTags("spillway:", "prod", "rec-1", map[string]string{"team": "nlp", "job": "j-9"})
	raw["Name"] = "someone else's tag"
	cluster, record, tags := DecodeTags("spillway:", raw)
	if cluster != "prod" || record != "rec-1" {
		t.Errorf("cluster, record = %q, %q", cluster, record)
	}
	if diff := cmp.Diff(map[string]string{"team": "nlp", "job": "j-9"}, tags); diff != "" {
		t.Error(diff)
	}
}

func TestSortOffersPrepaidThenCheapest(t *testing.T) {
	offers := []Offer{
		{Provider: "aws", InstanceType: "p5", PricePerHour: 98 * billing.MicrosPerUnit, Available: true},
		{Provider: "aws", InstanceType: "g6", PricePerHour: 1 * billing.MicrosPerUnit, Available: false},
		{Provider: "pool", InstanceType: "box-1", PricePerHour: 20 * billing.MicrosPerUnit, Prepaid: true, Available: true},
		{Provider: "aws", InstanceType: "p4", PricePerHour: 32 * billing.MicrosPerUnit, Available: true},
	}
	SortOffers(offers)
	var got []string
	for _, o := range offers {
		got = append(got, o.InstanceType)
	}
	if diff := cmp.Diff([]string{"box-1", "p4", "p5", "g6"}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if p := (Offer{PricePerHour: 98_320_000, GPUs: 8}).PricePerGPUHour(); p != 12_290_000 {
		t.Errorf("PricePerGPUHour = %v, want 12.29", p)
	}
}

func TestConsoleHostKeysTakesTheFirstBlock(t *testing.T) {
	console := `[   10.1] cloud-init[900]: ci-info: no authorized SSH keys
ec2: #############################################################
ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
ec2: 256 SHA256:abc root@ip-10-0-0-1 (ED25519)
ec2: -----END SSH HOST KEY FINGERPRINTS-----
ec2: #############################################################
-----BEGIN SSH HOST KEY KEYS-----
` + edKey + `
-----END SSH HOST KEY KEYS-----
later, something printing a second block:
-----BEGIN SSH HOST KEY KEYS-----
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE9ZiPc5ZKsHS2r7bkpV8W7cS4qbvaRhEJK6fY9TnHMq attacker
-----END SSH HOST KEY KEYS-----
`
	keys := ParseConsoleHostKeys(console)
	if len(keys) != 1 || string(ssh.MarshalAuthorizedKey(keys[0])) != strings.TrimSuffix(edKey, " broker")+"\n" {
		t.Fatalf("keys = %v, want the first block's key", keys)
	}
	if got := ParseConsoleHostKeys("booting...\n-----BEGIN SSH HOST KEY KEYS-----\n" + edKey + "\n"); got != nil {
		t.Errorf("an unterminated block gave %v, want nothing yet", got)
	}
}

func TestUserDataKeepsTheBrokerKeyBesideTheUsers(t *testing.T) {
	cc := CloudConfig{SSHAuthorizedKeys: []string{edKey}}
	plain, err := UserData(cc, "")
	if err != nil {
		t.Fatal(err)
	}
	var plainCC CloudConfig
	if err := yaml.Unmarshal([]byte(plain), &plainCC); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(plain, "#cloud-config\n") || len(plainCC.SSHAuthorizedKeys) != 1 || plainCC.SSHAuthorizedKeys[0] != edKey {
		t.Errorf("plain user data:\n%s", plain)
	}
	extra := "#!/bin/sh\necho hello\n"
	mixed, err := UserData(cc, extra)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := mail.ReadMessage(strings.NewReader(mixed))
	if err != nil {
		t.Fatal(err)
	}
	_, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	var types []string
	var last string
	for {
		p, err := mr.NextPart()
		if err != nil {
			break
		}
		types = append(types, strings.Split(p.Header.Get("Content-Type"), ";")[0])
		b := new(strings.Builder)
		_, _ = fmt.Fprint(b, readAll(t, p))
		last = b.String()
	}
	if diff := cmp.Diff([]string{"text/x-shellscript", "text/cloud-config"}, types); diff != "" {
		t.Errorf("parts (-want +got):\n%s", diff)
	}
	var back CloudConfig
	if err := yaml.Unmarshal([]byte(last), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.MergeHow) == 0 || back.SSHAuthorizedKeys[0] != edKey {
		t.Errorf("provider part = %+v, want the key and an append merge", back)
	}
}

func readAll(t *testing.T, p *multipart.Part) string {
	t.Helper()
	b := new(strings.Builder)
	buf := make([]byte, 4096)
	for {
		n, err := p.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

func TestParseAuthorizedKeysSkipsComments(t *testing.T) {
	keys, err := ParseAuthorizedKeys("# pinned\n\n" + edKey + "\n")
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys, err = %v, %v", keys, err)
	}
	if _, err := ParseAuthorizedKeys("ssh-ed25519 notbase64"); err == nil {
		t.Error("a broken key was accepted")
	}
}
