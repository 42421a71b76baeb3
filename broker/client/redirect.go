package client

import (
	"errors"
	"net/http"
)

// followRedirects is the client's redirect policy. A standby broker
// answers writes with 307 to the leader's advertise URL, and Go keeps the
// method and body of a 307 but drops Authorization when the redirect goes
// to another host: the token is put back, since the brokers of one
// cluster share their tokens.
func followRedirects(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.Header.Get("Authorization") == "" {
		if a := via[0].Header.Get("Authorization"); a != "" {
			req.Header.Set("Authorization", a)
		}
	}
	return nil
}
