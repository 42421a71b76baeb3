package providers

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"strings"

	"sigs.k8s.io/yaml"
)

// CloudConfig is the part of cloud-init's #cloud-config document the
// providers write: who may log in, and (for backends that publish no host
// keys) which host key the machine must use.
type CloudConfig struct {
	// SSHAuthorizedKeys are added to the image's default user.
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
	// SSHKeys are host keys cloud-init installs instead of generating them
	// ("ed25519_private", "ed25519_public").
	SSHKeys map[string]string `json:"ssh_keys,omitempty"`
	// SSHGenKeyTypes lists the host key types cloud-init generates; a
	// pointer so that an empty list ("generate none") can be written.
	SSHGenKeyTypes *[]string `json:"ssh_genkeytypes,omitempty"`
	// MergeHow tells cloud-init how to merge this part with earlier ones.
	MergeHow []MergeRule `json:"merge_how,omitempty"`
}

// MergeRule is one entry of cloud-init's merge_how.
type MergeRule struct {
	Name     string   `json:"name"`
	Settings []string `json:"settings"`
}

// appendMerge makes lists from this part add to, never replace, lists
// from earlier parts: the broker's key survives a user's own
// ssh_authorized_keys.
var appendMerge = []MergeRule{
	{Name: "list", Settings: []string{"append"}},
	{Name: "dict", Settings: []string{"no_replace", "recurse_list"}},
}

const mimeBoundary = "==SPILLWAY-CLOUD-INIT=="

// UserData renders cc as a #cloud-config document. When extra (the
// request's own user data) is not empty, the result is a MIME multipart
// archive, which cloud-init reads part by part: extra first, then the
// provider's cloud-config, merged so that its lists are appended.
func UserData(cc CloudConfig, extra string) (string, error) {
	if extra == "" {
		return renderCloudConfig(cc)
	}
	cc.MergeHow = appendMerge
	doc, err := renderCloudConfig(cc)
	if err != nil {
		return "", err
	}
	if strings.Contains(extra, mimeBoundary) {
		return "", fmt.Errorf("user data contains the MIME boundary %q: %w", mimeBoundary, ErrInvalidRequest)
	}
	var buf bytes.Buffer
	buf.WriteString("Content-Type: multipart/mixed; boundary=\"" + mimeBoundary + "\"\nMIME-Version: 1.0\n\n")
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(mimeBoundary); err != nil {
		return "", fmt.Errorf("write user data: %w", err)
	}
	for _, part := range []string{extra, doc} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", partType(part)+`; charset="utf-8"`)
		h.Set("MIME-Version", "1.0")
		pw, err := w.CreatePart(h)
		if err != nil {
			return "", fmt.Errorf("write user data: %w", err)
		}
		if _, err := pw.Write([]byte(part)); err != nil {
			return "", fmt.Errorf("write user data: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("write user data: %w", err)
	}
	return buf.String(), nil
}

func renderCloudConfig(cc CloudConfig) (string, error) {
	b, err := yaml.Marshal(cc)
	if err != nil {
		return "", fmt.Errorf("write cloud-config: %w", err)
	}
	return "#cloud-config\n" + string(b), nil
}

// partType is the MIME type cloud-init expects for a user-data part, from
// its first line, as cloud-init's own "include" detection reads it.
func partType(s string) string {
	switch {
	case strings.HasPrefix(s, "#cloud-config"):
		return "text/cloud-config"
	case strings.HasPrefix(s, "#!"):
		return "text/x-shellscript"
	case strings.HasPrefix(s, "#cloud-boothook"):
		return "text/cloud-boothook"
	case strings.HasPrefix(s, "#include"):
		return "text/x-include-url"
	default:
		return "text/plain"
	}
}
