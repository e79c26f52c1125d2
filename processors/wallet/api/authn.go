package api

// Authentication: who calls (an app's signature, a user's token) and what
// each may open.

import (
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"surge/processors/wallet/auth"
)

// denied answers a refused caller: 401 for no or bad credentials, 403
// for good credentials that do not open this.
func denied(w http.ResponseWriter, err error) {
	if errors.Is(err, auth.ErrForbidden) {
		fail(w, http.StatusForbidden, err)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="surge-wallet"`)
	fail(w, http.StatusUnauthorized, err)
}

// userOf returns the subject of the request's user token.
func (s *Server) userOf(r *http.Request) (string, error) {
	tok := auth.Bearer(r)
	if tok == "" {
		return "", fmt.Errorf("%w: no user token (want Authorization: Bearer <token>)", auth.ErrUnauthenticated)
	}
	if s.cfg.Users == nil {
		return "", fmt.Errorf("%w: no user keys configured", auth.ErrUnauthenticated)
	}
	c, err := s.cfg.Users.Verify(tok, s.now())
	return c.Sub, err
}

// appOf returns the app that signed r, a request without a body ("" with
// authentication off); signedBody is its counterpart for a body.
func (s *Server) appOf(r *http.Request) (string, error) {
	if s.authOff() {
		return "", nil
	}
	if s.cfg.Apps == nil {
		return "", fmt.Errorf("%w: no app keys configured", auth.ErrUnauthenticated)
	}
	return s.cfg.Apps.Verify(r, nil, s.now())
}

// user lets through only the holder of a user token for the path's actID.
func (s *Server) user(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authOff() {
			next(w, r)
			return
		}
		sub, err := s.userOf(r)
		if err == nil && sub != r.PathValue("act") {
			err = fmt.Errorf("%w: the token is %s's, not %s's", auth.ErrForbidden, sub, r.PathValue("act"))
		}
		if err != nil {
			denied(w, err)
			return
		}
		next(w, r)
	}
}

// app lets through only a signed activity service (an app key): an
// identity links one person's accounts across apps, which no user token
// may ask for, not even its own holder's.
func (s *Server) app(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authOff() {
			next(w, r)
			return
		}
		if r.Header.Get(auth.HeaderSignature) == "" {
			err := fmt.Errorf("%w: only signed activity services (app keys) may read identities", auth.ErrForbidden)
			if auth.Bearer(r) == "" {
				err = fmt.Errorf("%w: no app signature", auth.ErrUnauthenticated)
			}
			denied(w, err)
			return
		}
		if _, err := s.appOf(r); err != nil {
			denied(w, err)
			return
		}
		next(w, r)
	}
}

// anyone lets through any authenticated caller: a user or an app.
func (s *Server) anyone(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authOff() {
			next(w, r)
			return
		}
		var err error
		if r.Header.Get(auth.HeaderSignature) != "" {
			_, err = s.appOf(r)
		} else {
			_, err = s.userOf(r)
		}
		if err != nil {
			denied(w, err)
			return
		}
		next(w, r)
	}
}
