// Package importrules holds no code: its test checks every package of the
// module against docs/design.md's layout table — each package has a row,
// and imports only what its row says — so that the import rules the design
// promises fail a test when a change breaks them, not a later review.
package importrules
