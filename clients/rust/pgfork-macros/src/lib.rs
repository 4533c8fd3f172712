//! `#[pgfork::test]`: use it through the `pgfork` crate (feature `sqlx`).

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ItemFn, Lit, LitStr, Meta, Token};

/// A drop-in for `#[sqlx::test]`: the test gets a database of its own, cloned
/// by `pgfork serve` from a template that was migrated (and seeded with the
/// fixtures) once for every test binary and run.
///
/// Arguments, as `#[sqlx::test]`'s: `migrations = "dir"` (relative to the
/// crate's Cargo.toml; default `migrations` when that directory exists),
/// `migrator = "path::MIGRATOR"`, `migrations = false`, and
/// `fixtures("name", "dir/x.sql", …)` or `fixtures(path = "dir", scripts("a", "b"))`
/// (files relative to the test's source file; a bare name is `fixtures/<name>.sql`).
///
/// The function is an `async fn` taking `PgPool`, `PgConnection`,
/// `PoolConnection<Postgres>`, `(PgPoolOptions, PgConnectOptions)` or
/// `PgConnectOptions`, returning `()` or a `Result`.
#[proc_macro_attribute]
pub fn test(args: TokenStream, input: TokenStream) -> TokenStream {
    match expand(args.into(), input.into()) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

enum Mig {
    Inferred,
    Dir(LitStr),
    Migrator(syn::Path),
    None,
}

struct Fixture {
    file: String,
    span: Span,
}

fn expand(args: proc_macro2::TokenStream, input: proc_macro2::TokenStream) -> syn::Result<proc_macro2::TokenStream> {
    let item: ItemFn = syn::parse2(input)?;
    let metas = syn::parse::Parser::parse2(Punctuated::<Meta, Token![,]>::parse_terminated, args)?;
    let mut mig = Mig::Inferred;
    let mut mig_set: Option<Span> = None;
    let mut fixtures: Vec<Fixture> = Vec::new();
    for m in metas {
        let span = m.span();
        let set_mig = |mig_set: &mut Option<Span>| -> syn::Result<()> {
            if mig_set.is_some() {
                return Err(syn::Error::new(
                    span,
                    "#[pgfork::test]: give one of `migrations = \"dir\"`, `migrator = \"path::MIGRATOR\"`, `migrations = false`",
                ));
            }
            *mig_set = Some(span);
            Ok(())
        };
        match &m {
            Meta::NameValue(nv) if nv.path.is_ident("migrations") => {
                set_mig(&mut mig_set)?;
                mig = match &nv.value {
                    Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Mig::Dir(s.clone()),
                    Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) if !b.value => Mig::None,
                    other => {
                        return Err(syn::Error::new(
                            other.span(),
                            "#[pgfork::test]: `migrations` takes a directory (\"migrations\") or `false`",
                        ));
                    }
                };
            }
            Meta::NameValue(nv) if nv.path.is_ident("migrator") => {
                set_mig(&mut mig_set)?;
                mig = match &nv.value {
                    Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Mig::Migrator(s.parse().map_err(|_| {
                        syn::Error::new(
                            s.span(),
                            "#[pgfork::test]: `migrator` takes the path of a static, such as \"crate::MIGRATOR\"",
                        )
                    })?),
                    other => {
                        return Err(syn::Error::new(
                            other.span(),
                            "#[pgfork::test]: `migrator` takes the path of a static as a string, such as \"crate::MIGRATOR\"",
                        ));
                    }
                };
            }
            Meta::List(l) if l.path.is_ident("fixtures") => {
                let parsed: FixtureArgs = syn::parse2(l.tokens.clone())?;
                fixtures.extend(parsed.0);
            }
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "#[pgfork::test]: unknown argument; it takes `migrations = \"dir\"`, `migrator = \"path::MIGRATOR\"`, \
                     `migrations = false` and `fixtures(…)`",
                ));
            }
        }
    }

    let sig = &item.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "#[pgfork::test] needs an `async fn` (as #[sqlx::test]): it runs it on a tokio runtime of its own",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "#[pgfork::test]: a test function cannot be generic",
        ));
    }
    let n = sig.inputs.len();
    if n > 2 {
        return Err(syn::Error::new(
            sig.inputs.span(),
            "#[pgfork::test]: a test takes at most two parameters: (PgPool), (PgConnection), \
             (PoolConnection<Postgres>), (PgPoolOptions, PgConnectOptions) or (PgConnectOptions)",
        ));
    }
    if n == 0 {
        return Err(syn::Error::new(
            sig.ident.span(),
            "#[pgfork::test]: the test takes no database; give it a parameter: PgPool, PgConnection, \
             PoolConnection<Postgres>, (PgPoolOptions, PgConnectOptions) or PgConnectOptions (or use #[tokio::test])",
        ));
    }
    if let Some(syn::FnArg::Receiver(r)) = sig.inputs.first() {
        return Err(syn::Error::new(r.span(), "#[pgfork::test]: a test cannot take self"));
    }

    let migrations = match mig {
        Mig::Inferred => {
            let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
            if !dir.is_empty() && std::path::Path::new(&dir).join("migrations").is_dir() {
                quote! { args.migrations_dir(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/migrations")); }
            } else {
                quote! {}
            }
        }
        Mig::Dir(d) => {
            let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
            if !dir.is_empty() && !std::path::Path::new(&dir).join(d.value()).is_dir() {
                return Err(syn::Error::new(
                    d.span(),
                    format!(
                        "#[pgfork::test]: no directory {:?} next to Cargo.toml ({dir})",
                        d.value()
                    ),
                ));
            }
            quote! { args.migrations_dir(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/", #d)); }
        }
        Mig::Migrator(p) => quote_spanned! {p.span()=>
            {
                let migrator: &'static ::sqlx::migrate::Migrator = &#p;
                args.migrator(migrator);
            }
        },
        Mig::None => quote! {},
    };
    let fixture_items = fixtures.iter().map(|f| {
        let file = &f.file;
        quote_spanned! {f.span=> ::pgfork::testing::TestFixture { path: #file, contents: ::core::include_str!(#file) } }
    });

    let attrs = &item.attrs;
    let vis = &item.vis;
    let name = &sig.ident;
    let ret = &sig.output;
    let inputs = &sig.inputs;
    let body = &item.block;
    let holes = (0..n).map(|_| quote!(_));
    let fn_ty = quote_spanned! {sig.inputs.span()=> fn(#(#holes),*) -> _ };
    Ok(quote! {
        #[::core::prelude::v1::test]
        #(#attrs)*
        #vis fn #name() #ret {
            async fn #name(#inputs) #ret #body
            let mut args = ::pgfork::testing::TestArgs::new(::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)));
            #migrations
            args.fixtures(&[#(#fixture_items),*]);
            let f: #fn_ty = #name;
            ::pgfork::testing::TestFn::run_test(f, args)
        }
    })
}

struct FixtureArgs(Vec<Fixture>);

impl Parse for FixtureArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut out = Vec::new();
        let mut dir: Option<String> = None;
        let mut scripts: Vec<LitStr> = Vec::new();
        while !input.is_empty() {
            if input.peek(LitStr) {
                let s: LitStr = input.parse()?;
                let v = s.value();
                let file = if v.ends_with(".sql") {
                    v
                } else {
                    format!("fixtures/{v}.sql")
                };
                out.push(Fixture { file, span: s.span() });
            } else {
                let key: syn::Ident = input.parse()?;
                if key == "path" {
                    input.parse::<Token![=]>()?;
                    let s: LitStr = input.parse()?;
                    dir = Some(s.value());
                } else if key == "scripts" {
                    let content;
                    syn::parenthesized!(content in input);
                    scripts.extend(Punctuated::<LitStr, Token![,]>::parse_terminated(&content)?);
                } else {
                    return Err(syn::Error::new(
                        key.span(),
                        "#[pgfork::test]: fixtures take file names (\"users\" is fixtures/users.sql), paths ending in .sql, \
                         or `path = \"dir\", scripts(\"a\", \"b\")`",
                    ));
                }
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        if !scripts.is_empty() || dir.is_some() {
            let Some(dir) = dir else {
                return Err(input.error("#[pgfork::test]: fixtures(scripts(…)) needs `path = \"dir\"`"));
            };
            for s in scripts {
                let v = s.value();
                let name = if v.ends_with(".sql") { v } else { format!("{v}.sql") };
                out.push(Fixture {
                    file: format!("{}/{name}", dir.trim_end_matches('/')),
                    span: s.span(),
                });
            }
        }
        Ok(FixtureArgs(out))
    }
}
