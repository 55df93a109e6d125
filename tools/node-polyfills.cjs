// Polyfills for Node 18/20 loaded with NODE_OPTIONS=--require <this file> (docs/platform.md).
// js-ipfs 0.66.1 pulls in newer dependencies (mortice, it-queue, abort-error) that call
// Promise.withResolvers, which Node only ships from version 22.
'use strict'
if (typeof Promise.withResolvers !== 'function') {
  Object.defineProperty(Promise, 'withResolvers', {
    configurable: true,
    writable: true,
    value: function withResolvers () {
      let resolve
      let reject
      const promise = new this((res, rej) => { resolve = res; reject = rej })
      return { promise, resolve, reject }
    }
  })
}
