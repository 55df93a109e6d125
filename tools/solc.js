#!/usr/bin/env node
// A `solc` command-line stand-in backed by the official npm `solc` package (the emscripten build),
// so py-solc-x and ape-solidity can compile with no network and no native binary.
//
// It answers the calls those libraries make (docs/platform.md):
//   solc --version                       -> "Version: X.Y.Z+commit.HASH..." on stdout
//   solc --standard-json [--base-path D] [--include-path D]... [--allow-paths A,B]
//                                        -> standard-JSON input on stdin, output JSON on stdout
//   solc --help                          -> usage text (py-solc-x's compile_source probes it)
// Unlike `solcjs --standard-json`, nothing but the JSON is ever written to stdout.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

function usage() {
  return [
    "solc, the solidity compiler commandline interface (npm solc " + solc.version() + ")",
    "",
    "Usage: solc --standard-json [--base-path DIR] [--include-path DIR]... [--allow-paths A,B]",
    "       solc --version",
    "",
    "Options:",
    "  --version          Print the compiler version.",
    "  --standard-json    Read standard-JSON input on stdin, write standard-JSON output.",
    "  --base-path        Root for resolving imports.",
    "  --include-path     Extra roots for resolving imports.",
    "  --allow-paths      Accepted for compatibility; imports are confined to the roots above.",
    "",
  ].join("\n");
}

function parseArgs(argv) {
  const opts = { standardJson: false, version: false, help: false, roots: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const takeValue = () => {
      if (a.includes("=")) return a.slice(a.indexOf("=") + 1);
      i += 1;
      return argv[i];
    };
    if (a === "--version") opts.version = true;
    else if (a === "--help" || a === "-h") opts.help = true;
    else if (a === "--standard-json") opts.standardJson = true;
    else if (a.startsWith("--base-path")) opts.roots.unshift(takeValue());
    else if (a.startsWith("--include-path")) opts.roots.push(takeValue());
    else if (a.startsWith("--allow-paths")) takeValue();
    else {
      process.stderr.write("solc (npm wrapper): unsupported argument " + JSON.stringify(a) + "\n");
      process.exit(2);
    }
  }
  return opts;
}

function makeImportCallback(roots) {
  const bases = roots.length ? roots : [process.cwd()];
  return function findImports(importPath) {
    const candidates = path.isAbsolute(importPath)
      ? [importPath]
      : bases.map((b) => path.resolve(b, importPath));
    for (const file of candidates) {
      try {
        return { contents: fs.readFileSync(file, "utf8") };
      } catch (e) {
        // try the next root
      }
    }
    return { error: "File not found: " + importPath + " (searched " + bases.join(", ") + ")" };
  };
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.version) {
    process.stdout.write(
      "solc, the solidity compiler commandline interface\nVersion: " + solc.version() + "\n"
    );
    return 0;
  }
  if (opts.help || !opts.standardJson) {
    process.stdout.write(usage());
    return opts.help ? 0 : 1;
  }
  const input = fs.readFileSync(0, "utf8");
  const output = solc.compile(input, { import: makeImportCallback(opts.roots) });
  process.stdout.write(output);
  return 0;
}

process.exitCode = main();
