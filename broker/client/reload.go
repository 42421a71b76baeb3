package client

import (
	"context"
	"net/http"

	"github.com/spillway-dev/spillway/broker/server"
)

// ReloadConfig asks the broker to read its config file again and apply
// it, as SIGHUP does (operator). A refused file comes back as an error
// naming the field; nothing changed then.
func (c *Client) ReloadConfig(ctx context.Context) (server.ReloadResult, error) {
	var out server.ReloadResult
	err := c.getJSON(ctx, http.MethodPost, "/v1/config/reload", nil, "", &out)
	return out, err
}
