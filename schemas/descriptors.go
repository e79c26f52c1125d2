package schemas

import (
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// DescriptorSet is the serialized FileDescriptorSet of every schema the
// topics carry and the files they import, dependencies first (as protoc
// --descriptor_set_in and schema registries expect).
func DescriptorSet() ([]byte, error) {
	var files []protoreflect.FileDescriptor
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		files = append(files, fd)
	}
	var names []string
	for name := range registry {
		names = append(names, name)
	}
	slices.Sort(names) // the same bytes from every build of the same schemas
	for _, name := range names {
		add(registry[name].New().ProtoReflect().Descriptor().ParentFile())
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, fd := range files {
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(set)
}
