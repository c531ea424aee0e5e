// Package auth decides who may call the data server. A Guard admits or
// refuses each gRPC call before its handler runs: on the user listener
// (reached through port-forward) either every caller, or callers whose
// bearer token a TokenReview authenticates and a SubjectAccessReview
// authorizes per verb; on the agent listener only pods of agent Jobs the
// server created, each for exactly its own backup. It talks to the
// Kubernetes API (authentication.k8s.io, authorization.k8s.io, pods, jobs)
// and to nothing else.
package auth
