package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/oauth2"
)

// loginCmd is `spillway login`: the OAuth device authorization flow with
// the broker's OIDC provider; the session lands in the CLI config.
func loginCmd(g *globals) *cobra.Command {
	var noSave bool
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Log in with your organisation's account (OIDC device flow)",
		Long: `Log in with your organisation's identity provider. The CLI shows a URL
and a code; open the URL anywhere (another machine is fine), enter the code,
and the CLI gets a session from the broker: your role and team come from
your account (docs/security.md). The session is saved as token: in
~/.config/spillway/config and lasts oidc.sessionTTL (12h unless set).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			file := loadCLIConfig()
			// The same broker, CA and HA peers as every other verb.
			server := g.serverURL()
			ca := firstNonEmpty(g.ca, os.Getenv("SPILLWAY_CA"), file.CA)
			c, err := g.clientWithToken("")
			if err != nil {
				return err
			}
			lc, err := c.LoginConfig(ctx)
			if err != nil {
				return fmt.Errorf("ask the broker how to log in: %w", err)
			}
			if lc.DeviceAuthorizationEndpoint == "" {
				return errors.New("the OIDC provider offers no device authorization endpoint; log in on the dashboard, or use an API token")
			}
			oc := &oauth2.Config{ClientID: lc.ClientID, Scopes: lc.Scopes,
				Endpoint: oauth2.Endpoint{DeviceAuthURL: lc.DeviceAuthorizationEndpoint, TokenURL: lc.TokenEndpoint}}
			// The provider is the site's own, reached with the system's roots.
			octx := context.WithValue(ctx, oauth2.HTTPClient, &http.Client{Timeout: time.Minute})
			da, err := oc.DeviceAuth(octx)
			if err != nil {
				return fmt.Errorf("start the device login: %w", err)
			}
			if da.VerificationURIComplete != "" {
				fmt.Fprintf(g.stderr, "Open %s\n(or %s and enter the code %s)\n", da.VerificationURIComplete, da.VerificationURI, da.UserCode)
			} else {
				fmt.Fprintf(g.stderr, "Open %s and enter the code %s\n", da.VerificationURI, da.UserCode)
			}
			tok, err := oc.DeviceAccessToken(octx, da)
			if err != nil {
				return fmt.Errorf("wait for the login: %w", err)
			}
			idt, ok := tok.Extra("id_token").(string)
			if !ok || idt == "" {
				return errors.New("the provider answered without an ID token (is the openid scope allowed for this client?)")
			}
			ans, err := c.Login(ctx, idt)
			if err != nil {
				return err
			}
			team := ""
			if ans.Principal.Team != "" {
				team = ", team " + ans.Principal.Team
			}
			fmt.Fprintf(g.stdout, "logged in as %s (%s%s) until %s\n", ans.Principal.Name, ans.Principal.Role, team, ans.ExpiresAt.Local().Format(time.DateTime))
			if noSave {
				fmt.Fprintln(g.stdout, ans.Token)
				return nil
			}
			return saveCLISession(server, ans.Token, ca)
		},
	}
	cmd.Flags().BoolVar(&noSave, "no-save", false, "print the session token instead of saving it in the CLI config")
	return cmd
}

// saveCLISession writes server, token and ca to the CLI config file.
func saveCLISession(server, token, ca string) error {
	p := cliConfigPath()
	if p == "" {
		return errors.New("no config directory for ~/.config/spillway/config; use --no-save and SPILLWAY_TOKEN")
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server: %s\ntoken: %s\n", server, token)
	if ca != "" {
		fmt.Fprintf(&b, "ca: %s\n", ca)
	}
	return os.WriteFile(p, []byte(b.String()), 0o600)
}
