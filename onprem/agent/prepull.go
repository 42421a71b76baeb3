package agent

import (
	"context"

	"github.com/spillway-dev/spillway/onprem/runtime"
)

// imagePuller is a runtime with a node-local image cache to fill.
type imagePuller interface {
	EnsureImage(ctx context.Context, image string, progress func(string)) *runtime.Exit
}

// prePull pulls the configured images into the node's cache in the
// background (a burst machine gets the queue's most-used ones), so the
// first jobs start without waiting for a pull.
func (ag *Agent) prePull(ctx context.Context) {
	p, ok := ag.rt.(imagePuller)
	if !ok || len(ag.cfg.Runtime.PrePull) == 0 {
		return
	}
	go func() {
		for _, img := range ag.cfg.Runtime.PrePull {
			if ctx.Err() != nil {
				return
			}
			if e := p.EnsureImage(ctx, img, nil); e != nil {
				ag.log.Warn("pre-pull failed", "image", img, "err", e.Message)
				continue
			}
			ag.log.Info("pre-pulled image", "image", img)
		}
	}()
}

// leftoverRemover is a runtime that can find what an earlier agent
// process left running.
type leftoverRemover interface {
	RemoveLeftovers(ctx context.Context) []string
}

// removeLeftoverContainers ends the containers a crashed agent left.
func (ag *Agent) removeLeftoverContainers(ctx context.Context) {
	if r, ok := ag.rt.(leftoverRemover); ok {
		for _, name := range r.RemoveLeftovers(ctx) {
			ag.log.Warn("removed a container left by a previous agent process", "container", name)
		}
	}
}
