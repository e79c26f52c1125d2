package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"surge/streams/metrics"
)

// version is the release, set at build time (-ldflags "-X main.version=v1.2.3");
// otherwise the module's version and VCS revision as the build recorded them.
var version = ""

// buildVersion is what `surge version` and surge_build_info say.
func buildVersion() (ver, revision string) {
	ver, revision = version, "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		if ver == "" {
			ver = info.Main.Version // "(devel)" for a local build
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	if ver == "" {
		ver = "(devel)"
	}
	return ver, revision
}

// cmdVersion prints the build.
func cmdVersion() {
	ver, rev := buildVersion()
	fmt.Printf("surge %s (revision %s, %s, %s/%s)\n", ver, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// registerBuildInfo sets surge_build_info{version,revision,go_version} 1,
// so a dashboard can say which build each instance runs.
func registerBuildInfo(reg *metrics.Registry) {
	ver, rev := buildVersion()
	reg.NewGaugeVec("surge_build_info", "the running build: 1, labelled with its version, VCS revision and Go version",
		"version", "revision", "go_version").With(ver, rev, runtime.Version()).Set(1)
}
