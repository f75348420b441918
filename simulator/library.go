package simulator

import (
	"embed"
	"io/fs"
	"sort"
	"strings"
)

//go:embed scenarios/*.yaml
var library embed.FS

// Library returns the names of the built-in scenarios, sorted.
func Library() []string {
	entries, err := fs.ReadDir(library, "scenarios")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(names)
	return names
}

// LibraryScenario returns the YAML of the built-in scenario name.
func LibraryScenario(name string) ([]byte, error) {
	return library.ReadFile("scenarios/" + name + ".yaml")
}
