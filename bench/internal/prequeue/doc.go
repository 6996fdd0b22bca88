// Package prequeue is package fence as it was before the queue of waiters
// (fencelock commit a7243a4, renamed): the bench measures it in the same
// run as today's fence, as the baseline that the fair lock's goals are
// ratios against. It is a frozen copy for measurement only; nothing else
// imports it.
package prequeue
