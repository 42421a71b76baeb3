package agent

import (
	"errors"
	"net/http"
)

// brokerHTTP is the agent's HTTP client. Several brokers may share one
// store, one of them leading: a standby answers the agent with 307 to the
// leader's own URL. Go keeps a 307's method and body but drops
// Authorization when the redirect goes to another host, so the token is
// put back (the brokers of one cluster share the agent tokens).
func brokerHTTP() *http.Client {
	return &http.Client{CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		if req.Header.Get("Authorization") == "" {
			if a := via[0].Header.Get("Authorization"); a != "" {
				req.Header.Set("Authorization", a)
			}
		}
		return nil
	}}
}
