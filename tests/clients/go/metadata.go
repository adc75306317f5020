package main

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// kmsgMetadata asks for every broker (no topics).
func kmsgMetadata() kmsg.Request {
	r := kmsg.NewPtrMetadataRequest()
	r.Topics = []kmsg.MetadataRequestTopic{}
	return r
}

// metadataBrokers lists the "id@host:port" of every broker in a Metadata response.
func metadataBrokers(resp kmsg.Response) []string {
	md, ok := resp.(*kmsg.MetadataResponse)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(md.Brokers))
	for _, b := range md.Brokers {
		out = append(out, fmt.Sprintf("%d@%s:%d", b.NodeID, b.Host, b.Port))
	}
	return out
}
