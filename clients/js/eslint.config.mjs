import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/**", "**/node_modules/**"] },
  js.configs.recommended,
  ...tseslint.configs.strict,
  {
    files: ["**/*.mjs", "**/*.cjs", "**/*.js"],
    languageOptions: {
      globals: { process: "readonly", console: "readonly", require: "readonly", module: "writable", exports: "writable", __dirname: "readonly", URL: "readonly", Buffer: "readonly", setTimeout: "readonly", AbortController: "readonly", test: "readonly", expect: "readonly", beforeEach: "readonly", afterEach: "readonly" },
    },
    rules: { "@typescript-eslint/no-require-imports": "off" },
  },
);
