package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func backupCmd(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "backup -f FILE",
		Short: "Copy the broker's embedded store while it runs (operators)",
		Long: `Copy a consistent snapshot of the broker's embedded (bbolt) store through the
API while the broker keeps running. The copy is a complete store file: to
restore, stop the broker and put it in place of dataDir/spillway.db.
A Redis store is backed up with Redis's own RDB/AOF files (docs/operations.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("-f FILE is required")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			tmp, err := os.CreateTemp(filepath.Dir(out), ".spillway-backup-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			n, err := c.Backup(cmd.Context(), tmp)
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "wrote %s (%d bytes)\n", out, n)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "file", "f", "", "where to write the copy")
	return cmd
}
