//! The `kvtier` command.

fn main() -> std::process::ExitCode {
    kvtier_cli::cli::main()
}
