package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/spf13/viper"
)

// maxSlots bounds the instances of one component on one host that get an
// id without configuration.
const maxSlots = 64

// claimInstanceID gives a process that runs component without a
// configured processor.instance_id an id of its own on this host. The id
// is the transactional id's suffix, and two instances of one processor
// with the same id fence each other's transactions at every commit: two
// `surge run push-offline` on one machine, both defaulting to the host
// name, made no progress together. Each process takes the lowest free
// slot of its service and namespace, a file lock in the temporary
// directory that the kernel releases when the process dies: slot 1 is the
// host name as before, slot N the host name and "-N". A restart on the
// same host (kill -9 included) takes the same slot back, so the id stays
// stable and the restarted instance fences its predecessor's open
// transaction at once. release frees the slot; a configured id claims
// nothing.
func claimInstanceID(v *viper.Viper, component string, log *slog.Logger) (release func(), err error) {
	if v.GetString("processor.instance_id") != "" {
		return func() {}, nil
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "local"
	}
	// Slots per service and namespace: instances in other namespaces are
	// in other groups, with other transactional ids.
	key := component
	for _, ns := range []string{"push.namespace", "uin.namespace", "wallet.namespace"} {
		if s := v.GetString(ns); s != "" {
			key += "@" + s
		}
	}
	id, f, err := claimSlot(os.TempDir(), key, host)
	if errors.Is(err, errNoSlotFile) {
		// A read-only temporary directory (a locked-down container, where
		// the host name is the container's own): the id is the host name,
		// as it was before slots.
		log.Warn("instance id: no slot lock possible, using the host name; set processor.instance_id when several instances share a host", "err", err)
		v.Set("processor.instance_id", host)
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	v.Set("processor.instance_id", id)
	log.Info("instance id from this host's free slot (set processor.instance_id to choose one)", "instance_id", id)
	return func() { _ = f.Close() }, nil
}

var unsafeInFileName = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// errNoSlotFile: the slot's lock file cannot be opened or locked at all.
var errNoSlotFile = errors.New("slot lock file unusable")

// claimSlot locks the lowest free slot of component in dir and returns
// the id it stands for and the open lock file (closing it frees the slot).
func claimSlot(dir, component, host string) (string, *os.File, error) {
	name := unsafeInFileName.ReplaceAllString(component, "_")
	for slot := 1; slot <= maxSlots; slot++ {
		path := filepath.Join(dir, fmt.Sprintf("surge-instance-%s-%d.lock", name, slot))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return "", nil, fmt.Errorf("%w: %v", errNoSlotFile, err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue // another instance on this host holds it
			}
			return "", nil, fmt.Errorf("%w: lock %s: %v", errNoSlotFile, path, err)
		}
		if slot == 1 {
			return host, f, nil
		}
		return fmt.Sprintf("%s-%d", host, slot), f, nil
	}
	return "", nil, fmt.Errorf("instance id: %d instances of %s already run on this host; set processor.instance_id", maxSlots, component)
}
