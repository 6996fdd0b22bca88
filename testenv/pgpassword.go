package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PasswordGroup is the role whose members must log in with their password
// on the servers testenv starts: pg_hba.conf checks it (scram-sha-256) and
// trusts every other role. [DB.NewPasswordUser] makes such members.
const PasswordGroup = "testenv_password"

// passwordHBA is the pg_hba.conf line for PasswordGroup; it goes first,
// since the first matching line decides.
const passwordHBA = "host all +" + PasswordGroup + " 127.0.0.1/32 scram-sha-256\n"

// requirePasswords puts passwordHBA at the top of the data directory's
// pg_hba.conf.
func requirePasswords(data string) error {
	path := filepath.Join(data, "pg_hba.conf")
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("testenv: read pg_hba.conf: %w", err)
	}
	if err := os.WriteFile(path, append([]byte(passwordHBA), old...), 0o600); err != nil {
		return fmt.Errorf("testenv: write pg_hba.conf: %w", err)
	}
	return nil
}

// NewPasswordUser creates a login role with password that must give it to
// connect (a member of [PasswordGroup]), with every privilege on the
// database and the ownership of its public schema, and returns the role's
// name and the database's URL as that role, password included. The role
// is dropped at the end of the test. It fails the test when the server
// does not refuse a wrong password (an external server whose pg_hba.conf
// lacks the line for PasswordGroup).
func (db *DB) NewPasswordUser(t testing.TB, password string) (user, dbURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	user = "pw_" + strings.TrimPrefix(db.Name, "fence_") + "_" + randHex(3)
	c, err := pgx.Connect(ctx, db.DirectURL)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", db.Server.Addr, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{user}.Sanitize()
	for _, q := range []string{
		// Two tests may create the group at once: either error means it exists.
		`DO $$ BEGIN CREATE ROLE ` + PasswordGroup + ` NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`,
		`CREATE ROLE ` + ident + ` LOGIN IN ROLE ` + PasswordGroup + ` PASSWORD ` + quoteLiteral(password),
		`GRANT ALL ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + ident,
		`ALTER SCHEMA public OWNER TO ` + ident,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("testenv: %s: %v", strings.SplitN(q, " PASSWORD ", 2)[0], err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, db.DirectURL); err == nil {
			_, _ = c.Exec(ctx, `ALTER SCHEMA public OWNER TO CURRENT_USER`)
			_, _ = c.Exec(ctx, `DROP OWNED BY `+ident)
			_, _ = c.Exec(ctx, `DROP ROLE `+ident)
			_ = c.Close(ctx)
		}
	})
	dbURL = withUser(db.DirectURL, user, password)
	wrong, err := pgx.Connect(ctx, withUser(db.DirectURL, user, password+"-wrong"))
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		_ = wrong.Close(ctx)
		t.Fatalf("testenv: %s accepts a wrong password for %s: add %q at the top of its pg_hba.conf", db.Server.Addr, user, strings.TrimSpace(passwordHBA))
	case !errors.As(err, &pgErr) || pgErr.Code != "28P01":
		t.Fatalf("testenv: a wrong password for %s: want SQLSTATE 28P01, got %v", user, err)
	}
	return user, dbURL
}

// withUser returns the postgres:// URL u with user:password as its userinfo.
func withUser(u, user, password string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.User = url.UserPassword(user, password)
	return p.String()
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
