// CSS files are bundled by esbuild (web/build.mjs); importing one has no value.
declare module "*.css";
