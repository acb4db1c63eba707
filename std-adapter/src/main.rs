//! The `kvtier` command.

fn main() -> std::process::ExitCode {
    kvtier::cli::main()
}
