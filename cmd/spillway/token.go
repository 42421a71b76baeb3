package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/config"
)

func tokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "API tokens for people and automation (node join tokens: spillway node token)",
	}
	cmd.AddCommand(tokenCreateCmd(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "The tokens the broker accepts: name, role, team, revoked (operator)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.Tokens(cmd.Context())
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(ts)
			}
			w := g.table()
			fmt.Fprintln(w, "NAME\tROLE\tTEAM\tSTATE")
			for _, t := range ts {
				state := "active"
				if t.Revoked {
					state = "revoked"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", t.Name, t.Role, firstNonEmpty(t.Team, "-"), state)
			}
			return w.Flush()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "revoke NAME",
		Short: "Refuse a token from now on, across restarts and reloads (operator; audited)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.RevokeToken(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "token %s revoked; remove its entry from the config too\n", args[0])
			return nil
		},
	})
	return cmd
}

var tokenNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func tokenCreateCmd(g *globals) *cobra.Command {
	var name, role, team string
	cmd := &cobra.Command{
		Use:   "create --name NAME [--role user --team TEAM | --role operator|finance|agent]",
		Short: "Print a new random token and the auth.tokens entry (its SHA-256) to paste into the config",
		Long: `Print a new random API token and the auth.tokens entry that accepts it.
The entry holds only the token's SHA-256, so the config file holds no
secret: give the token to its owner (it is shown once), paste the entry
into the broker's config and reload it (kill -HUP the broker; spillway
config check FILE first).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !tokenNameRe.MatchString(name) {
				return fmt.Errorf("--name: must be 1-63 lowercase letters, digits, '.', '_' or '-', got %q", name)
			}
			switch role {
			case config.RoleUser:
				if !tokenNameRe.MatchString(team) {
					return fmt.Errorf("--team: is required for role user (the team the token acts for)")
				}
			case config.RoleOperator, config.RoleFinance, config.RoleAgent:
				if team != "" {
					return fmt.Errorf("--team: only role user acts for a team")
				}
			default:
				return fmt.Errorf("--role: must be user, operator, finance or agent, got %q", role)
			}
			tok := newToken()
			sum := sha256.Sum256([]byte(tok))
			hash := hex.EncodeToString(sum[:])
			if g.json() {
				return g.printJSON(map[string]string{"name": name, "role": role, "team": team, "token": tok, "tokenSHA256": hash})
			}
			entry := fmt.Sprintf("    - {name: %s, role: %s, tokenSHA256: %s}", name, role, hash)
			if team != "" {
				entry = fmt.Sprintf("    - {name: %s, role: %s, team: %s, tokenSHA256: %s}", name, role, team, hash)
			}
			fmt.Fprintf(g.stdout, "token:        %s\ntokenSHA256:  %s\n\n", tok, hash)
			fmt.Fprintf(g.stdout, "Give the token to %s; it is not stored anywhere and is shown only now.\n", name)
			fmt.Fprintf(g.stdout, "Paste this under auth.tokens in the broker's config, then reload it (kill -HUP the broker's pid):\n\n%s\n", entry)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "who or what uses the token (shown in logs and the audit log)")
	f.StringVar(&role, "role", config.RoleUser, "user, operator, finance or agent")
	f.StringVar(&team, "team", "", "the team a user token acts for")
	return cmd
}
