// Package wire is the transport the broker's clients share (the CLI, the
// agent, burst machines): the redirect policy and the TLS trust setup. It
// imports nothing of the broker, so agents can use it.
package wire

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// maxRedirects bounds a redirect chain.
const maxRedirects = 10

// RedirectPolicy returns an http.Client CheckRedirect function that
//
//   - follows only 307 and 308, which keep the method and the body (a 301,
//     302 or 303 would turn a POST cancel into a GET): others are an error;
//   - sends Authorization only to the host the request started at (same
//     scheme and hostname, as Go's own rule, and never from https down to
//     http) or to one of peers (the URLs of the cluster's other brokers,
//     whose standbys redirect to the leader); any other host gets the
//     request without the token.
func RedirectPolicy(peers []string) func(req *http.Request, via []*http.Request) error {
	trusted := map[string]bool{}
	for _, p := range peers {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.Host != "" {
			trusted[u.Scheme+"://"+strings.ToLower(u.Host)] = true
		}
	}
	return func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if req.Response != nil {
			switch req.Response.StatusCode {
			case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			default:
				return fmt.Errorf("broker answered %d redirect to %s: only 307 and 308 are followed (they keep the method)",
					req.Response.StatusCode, req.URL.Redacted())
			}
		}
		first := via[0]
		auth := first.Header.Get("Authorization")
		if SameOrigin(first.URL, req.URL) || trusted[req.URL.Scheme+"://"+strings.ToLower(req.URL.Host)] {
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			return nil
		}
		req.Header.Del("Authorization")
		return nil
	}
}

// SameOrigin reports whether to is the host from (same hostname, scheme
// not weakened from https to http). Ports may differ, as under Go's own
// redirect rule.
func SameOrigin(from, to *url.URL) bool {
	if from.Scheme == "https" && to.Scheme != "https" {
		return false
	}
	return strings.EqualFold(from.Hostname(), to.Hostname())
}
