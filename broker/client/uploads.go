package client

import (
	"bytes"
	"context"
	"errors"
	"net/http"

	"github.com/spillway-dev/spillway/onprem/workdir"
)

// UploadWorkdir sends a packed working directory unless the broker holds
// it already (same content hash), and reports whether it sent it.
func (c *Client) UploadWorkdir(ctx context.Context, a *workdir.Archive) (bool, error) {
	resp, err := c.do(ctx, http.MethodHead, "/v1/uploads/"+a.Hash, nil, "")
	if err == nil {
		resp.Body.Close()
		return false, nil
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		return false, err
	}
	resp, err = c.do(ctx, http.MethodPut, "/v1/uploads/"+a.Hash, bytes.NewReader(a.Data), "application/gzip")
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return true, nil
}
