package main

import (
	"context"
	"fmt"

	"github.com/spillway-dev/spillway/broker/client"
)

// submitArray submits a group of identical jobs as one array (indexes
// 0..len-1) in one call; element k is the group's item k.
func submitArray(ctx context.Context, c *client.Client, g []Item, o options) ([]submitted, error) {
	spec := specFor(g[0], o)
	spec.Name = "array"
	sub, err := c.SubmitArraySpec(ctx, spec, fmt.Sprintf("0-%d", len(g)-1))
	if err != nil {
		return nil, fmt.Errorf("submit array of %s…: %w", g[0].ID, err)
	}
	if sub.Array == nil || len(sub.Array.Jobs) != len(g) {
		return nil, fmt.Errorf("array of %d jobs: the broker did not answer with %d elements", len(g), len(g))
	}
	out := make([]submitted, len(g))
	for k, id := range sub.Array.Jobs {
		out[k] = submitted{item: g[k], id: id}
	}
	return out, nil
}
