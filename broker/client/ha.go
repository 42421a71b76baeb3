package client

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/onprem/wire"
)

// TrustCAFile makes the client trust exactly the CAs in the PEM bundle at
// path for the broker's certificate (instead of the system's roots).
func (c *Client) TrustCAFile(path string) error {
	ca, err := wire.ReadCA(path)
	if err != nil {
		return err
	}
	return c.TrustCA(ca)
}

// TrustCA is TrustCAFile with the bundle's bytes.
func (c *Client) TrustCA(caPEM []byte) error {
	tc, err := wire.ClientTLS(caPEM)
	if err != nil {
		return err
	}
	tr := newTransport()
	tr.TLSClientConfig = tc
	c.HTTP.Transport = tr
	return nil
}

// TrustPeers names the cluster's other brokers: a standby answers writes
// with 307 to the leader's own URL, and the token follows such a redirect
// only to the client's own host or to one of these (wire.RedirectPolicy).
func (c *Client) TrustPeers(urls []string) {
	c.HTTP.CheckRedirect = wire.RedirectPolicy(urls)
}

// retryUnavailable bounds how long a request is sent again while the
// brokers answer 503 with Retry-After.
const retryUnavailable = 20 * time.Second

// send runs req, and sends it again while the brokers answer 503 with
// Retry-After: an election in progress, or a leader waiting for its
// store. Those answers change nothing, so a submit is never doubled.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(retryUnavailable)
	for {
		resp, err := c.HTTP.Do(req)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			time.Now().After(deadline) || (req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
			return resp, err
		}
		wait := time.Second
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n >= 0 {
			wait = min(time.Duration(n)*time.Second, 5*time.Second)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-req.Context().Done():
			t.Stop()
			return nil, req.Context().Err()
		case <-t.C:
		}
	}
}
