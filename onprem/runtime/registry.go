package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// manifestAccept is what a size lookup accepts from a registry.
var manifestAccept = strings.Join([]string{
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.oci.image.index.v1+json",
	"application/vnd.docker.distribution.manifest.v2+json",
	"application/vnd.docker.distribution.manifest.list.v2+json",
}, ", ")

// splitRef splits an image reference into registry host, repository and
// tag or digest, the way Podman resolves it (a first part without a dot,
// colon or "localhost" is a Docker Hub path).
func splitRef(ref string) (host, repo, ver string) {
	host, rest := "docker.io", ref
	if first, after, ok := strings.Cut(ref, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		host, rest = first, after
	}
	if r, d, ok := strings.Cut(rest, "@"); ok {
		repo, ver = r, d
	} else if i := strings.LastIndex(rest, ":"); i >= 0 {
		repo, ver = rest[:i], rest[i+1:]
	} else {
		repo, ver = rest, "latest"
	}
	if host == "docker.io" {
		host = "registry-1.docker.io"
		if !strings.Contains(repo, "/") {
			repo = "library/" + repo
		}
	}
	return host, repo, ver
}

// registrySize reads the image's size from its registry's manifest
// (anonymously; 0 when the registry wants credentials or is away): the
// config plus the layers, for this node's platform when the reference is
// an index.
func registrySize(ctx context.Context, ref string, tls bool) int64 {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	host, repo, ver := splitRef(ref)
	scheme := "https"
	if !tls {
		scheme = "http"
	}
	c := &http.Client{}
	var token string
	get := func(ver string) (map[string]json.RawMessage, error) {
		for try := 0; try < 2; try++ {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s://%s/v2/%s/manifests/%s", scheme, host, repo, ver), nil)
			if err != nil {
				return nil, err
			}
			req.Header.Set("Accept", manifestAccept)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := c.Do(req)
			if err != nil {
				return nil, err
			}
			body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
			resp.Body.Close()
			if err != nil {
				return nil, err
			}
			if resp.StatusCode == http.StatusUnauthorized && token == "" {
				if token = anonymousToken(ctx, c, resp.Header.Get("WWW-Authenticate")); token != "" {
					continue
				}
			}
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("registry answered %d", resp.StatusCode)
			}
			var m map[string]json.RawMessage
			return m, json.Unmarshal(body, &m)
		}
		return nil, fmt.Errorf("registry wants credentials")
	}
	m, err := get(ver)
	if err != nil {
		return 0
	}
	if raw, ok := m["manifests"]; ok {
		var subs []struct {
			Digest   string
			Platform struct{ Architecture, OS string }
		}
		if json.Unmarshal(raw, &subs) != nil {
			return 0
		}
		found := false
		for _, s := range subs {
			if s.Platform.OS == "linux" && s.Platform.Architecture == goArch() {
				if m, err = get(s.Digest); err != nil {
					return 0
				}
				found = true
				break
			}
		}
		if !found {
			return 0
		}
	}
	var cfg struct{ Size int64 }
	var layers []struct{ Size int64 }
	_ = json.Unmarshal(m["config"], &cfg)
	_ = json.Unmarshal(m["layers"], &layers)
	total := cfg.Size
	for _, l := range layers {
		total += l.Size
	}
	return total
}

// anonymousToken follows a Bearer challenge without credentials, as
// public registries allow for pulls.
func anonymousToken(ctx context.Context, c *http.Client, challenge string) string {
	rest, ok := strings.CutPrefix(challenge, "Bearer ")
	if !ok {
		return ""
	}
	params := map[string]string{}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok {
			params[k] = strings.Trim(v, `"`)
		}
	}
	u, err := url.Parse(params["realm"])
	if err != nil || params["realm"] == "" {
		return ""
	}
	q := u.Query()
	for _, k := range []string{"service", "scope"} {
		if params[k] != "" {
			q.Set(k, params[k])
		}
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return ""
	}
	resp, err := c.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var t struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&t) != nil {
		return ""
	}
	if t.Token != "" {
		return t.Token
	}
	return t.AccessToken
}
