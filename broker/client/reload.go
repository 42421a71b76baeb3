package client

import (
	"context"
	"net/http"

	"github.com/spillway-dev/spillway/broker/api"
)

// ReloadConfig asks the broker to read its config file again and apply
// it, as SIGHUP does (operator). A refused file comes back as an error
// naming the field; nothing changed then.
func (c *Client) ReloadConfig(ctx context.Context) (api.ReloadResult, error) {
	var out api.ReloadResult
	err := c.getJSON(ctx, http.MethodPost, "/v1/config/reload", nil, "", &out)
	return out, err
}
