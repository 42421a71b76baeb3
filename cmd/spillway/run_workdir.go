package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/onprem/workdir"
)

// runFlags are `spillway run`'s runtime flags: the image, limits, mounts
// and the upload of the current directory.
type runFlags struct {
	image, memory, shm, user string
	mounts                   []string
	noUpload                 bool
	dir                      string
	max                      string
}

func (r *runFlags) register(f *pflag.FlagSet) {
	f.StringVar(&r.image, "image", "", "OCI image to run in (nodes with the oci runtime)")
	f.StringVar(&r.memory, "memory", "", "host memory limit, e.g. 16Gi (enforced: past it the job is OOM-killed)")
	f.StringVar(&r.shm, "shm-size", "", "size of /dev/shm in the container, e.g. 8Gi")
	f.StringVar(&r.user, "user", "", "user the job runs as (mapped to an unprivileged uid on the node)")
	f.StringArrayVar(&r.mounts, "mount", nil, "mount SOURCE:TARGET[:ro] from the operator's allow-list (repeatable)")
	f.BoolVar(&r.noUpload, "no-upload", false, "do not upload the current directory as the job's working directory")
	f.StringVar(&r.dir, "workdir-from", ".", "directory to upload as the job's working directory")
	f.StringVar(&r.max, "workdir-max", "500Mi", "refuse to upload a working directory larger than this")
}

// apply puts the flags into the spec.
func (r *runFlags) apply(s *broker.Spec) error {
	s.Image, s.User = r.image, r.user
	if r.memory != "" {
		q, err := broker.ParseQuantity(r.memory)
		if err != nil {
			return fmt.Errorf("--memory: %w", err)
		}
		s.Resources.Memory = broker.Quantity(q)
	}
	if r.shm != "" {
		q, err := broker.ParseQuantity(r.shm)
		if err != nil {
			return fmt.Errorf("--shm-size: %w", err)
		}
		s.ShmSize = broker.Quantity(q)
	}
	for _, m := range r.mounts {
		parts := strings.Split(m, ":")
		if len(parts) < 1 || len(parts) > 3 || parts[0] == "" || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
			return fmt.Errorf("--mount %q: want SOURCE[:TARGET[:ro]]", m)
		}
		mt := broker.Mount{Source: parts[0]}
		if len(parts) > 1 {
			mt.Target = parts[1]
		}
		mt.ReadOnly = len(parts) == 3 && parts[2] == "ro"
		s.Mounts = append(s.Mounts, mt)
	}
	return nil
}

// upload packs the directory, checks the cap before sending anything,
// and uploads it unless the broker has it already.
func (r *runFlags) upload(ctx context.Context, g *globals, c *client.Client, s *broker.Spec) error {
	if r.noUpload {
		return nil
	}
	maxSize, err := broker.ParseQuantity(r.max)
	if err != nil || maxSize <= 0 {
		return fmt.Errorf("--workdir-max %q: want a size like 500Mi", r.max)
	}
	if st, err := os.Stat(r.dir); err != nil || !st.IsDir() {
		return fmt.Errorf("--workdir-from %s: not a directory", r.dir)
	}
	a, err := workdir.Pack(r.dir, maxSize)
	if err != nil {
		return err
	}
	sent, err := c.UploadWorkdir(ctx, a)
	if err != nil {
		return fmt.Errorf("upload the working directory: %w", err)
	}
	if sent {
		fmt.Fprintf(g.stderr, "spillway: uploaded the working directory (%d files, %d bytes packed, %s)\n", a.Files, len(a.Data), a.Hash[:19])
	} else {
		fmt.Fprintf(g.stderr, "spillway: the working directory is unchanged since its last upload (%s)\n", a.Hash[:19])
	}
	s.WorkdirUpload = a.Hash
	return nil
}
