package runtime

import (
	"context"
	"strings"
)

// passBarrier holds the start at j.Barrier (a gang's start barrier).
func passBarrier(j *Job, image string) *Exit {
	if j.Barrier == nil {
		return nil
	}
	if err := j.Barrier(image); err != nil {
		return startFailure(ReasonRuntimeError, "start barrier: %v", err)
	}
	return nil
}

// imageID is the local image's id ("sha256:…"), the same on every node
// that holds the same image; "" when podman cannot say.
func (r *ociRuntime) imageID(ctx context.Context, image string) string {
	out, err := r.command(ctx, "image", "inspect", "--format", "{{.Id}}", image).Output()
	if err != nil {
		return ""
	}
	id := strings.TrimSpace(string(out))
	if id != "" && !strings.HasPrefix(id, "sha256:") {
		id = "sha256:" + id
	}
	return id
}
