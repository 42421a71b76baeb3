package agent

import (
	"crypto/tls"
	"net/http"

	"github.com/spillway-dev/spillway/onprem/wire"
)

// brokerHTTP is the agent's HTTP client. Several brokers may share one
// store, one of them leading: a standby answers the agent with 307 to the
// leader's own URL. The token follows a redirect only to the broker's own
// host or to one of peers (the cluster's other brokers), and only 307 and
// 308 are followed (wire.RedirectPolicy).
func brokerHTTP(peers []string, tc *tls.Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{CheckRedirect: wire.RedirectPolicy(peers), Transport: tr}
}
