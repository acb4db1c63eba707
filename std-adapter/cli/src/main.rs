//! The `kvtier` command.

fn main() -> std::process::ExitCode {
    kvtier_cli::Cli::parse().run()
}
