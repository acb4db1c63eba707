//! The hit-rate curve of a [`Sweep`], drawn with plotters as SVG or PNG: block hit rate
//! against capacity (log scale, chunks; GiB on a second axis when the model is known), one
//! line per policy and threshold, the infinite-cache bound dashed, and the smallest capacity
//! within one point of the best marked.
//!
//! Text is laid out with an embedded DejaVu Sans (plotters' `ab_glyph`), so a PNG needs no
//! system font.

use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::series::DashedLineSeries;
use plotters::style::FontStyle;

use crate::sweep::Checkpoint;
use crate::sweep::{Sweep, SweepPoint};

/// The margin of [`Sweep::knee`] the plot marks: one percentage point.
pub const KNEE_MARGIN: f64 = 0.01;

/// What to draw.
#[derive(Clone, Debug)]
pub struct PlotSpec<'a> {
    /// The sweep.
    pub sweep: &'a Sweep,
    /// The trace's name, for the title.
    pub trace: String,
    /// Tokens per chunk.
    pub block_tokens: u64,
    /// The infinite-cache bound as a fraction of request blocks, if known.
    pub bound: Option<f64>,
    /// The model and its exact CPU bytes per chunk, for the GiB axis.
    pub model: Option<(String, u64)>,
    /// Width and height in pixels.
    pub size: (u32, u32),
    /// The sampling rate when the curves are sampled estimates (drawn dashed, so labelled).
    pub sampled: Option<f64>,
    /// Exact replays beside a sampled curve (drawn as crosses, the largest error in the
    /// legend).
    pub checkpoints: &'a [Checkpoint],
}

/// Why a plot could not be drawn.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlotError {
    /// The file name does not end in `.svg` or `.png`.
    UnknownExtension(String),
    /// Width or height is outside 200..=8000 pixels.
    BadSize(u32, u32),
    /// The sweep has no point.
    Empty,
    /// The embedded font could not be loaded.
    Font,
    /// Drawing or writing the file failed.
    Draw(String),
}

impl core::fmt::Display for PlotError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlotError::UnknownExtension(p) => {
                write!(f, "{p}: the plot file must end in .svg or .png")
            }
            PlotError::BadSize(w, h) => {
                write!(f, "plot size {w}x{h}: each side must be 200 to 8000 pixels")
            }
            PlotError::Empty => f.write_str("nothing to plot"),
            PlotError::Font => f.write_str("the embedded font could not be loaded"),
            PlotError::Draw(e) => write!(f, "drawing the plot: {e}"),
        }
    }
}

impl core::error::Error for PlotError {}

/// A `--plot-size` that is not `WIDTHxHEIGHT` in pixels.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SizeSyntaxError {
    /// The text given.
    pub text: String,
}

impl fmt::Display for SizeSyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\" is not WIDTHxHEIGHT in pixels (e.g. 1200x750)",
            self.text
        )
    }
}

impl core::error::Error for SizeSyntaxError {}

/// Parses `WxH` (e.g. `1200x750`).
///
/// ```
/// assert_eq!(kvtier_cli::sweep::plot::parse_size("1200x750"), Ok((1200, 750)));
/// assert_eq!(
///     kvtier_cli::sweep::plot::parse_size("1200").unwrap_err().to_string(),
///     "\"1200\" is not WIDTHxHEIGHT in pixels (e.g. 1200x750)"
/// );
/// ```
///
/// # Errors
/// [`SizeSyntaxError`] for anything else.
pub fn parse_size(text: &str) -> Result<(u32, u32), SizeSyntaxError> {
    let bad = || SizeSyntaxError {
        text: text.to_owned(),
    };
    let (w, h) = text.split_once(['x', 'X']).ok_or_else(bad)?;
    Ok((
        w.trim().parse().map_err(|_| bad())?,
        h.trim().parse().map_err(|_| bad())?,
    ))
}

fn font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
            && plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
                .is_ok()
    });
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// Draws `spec` to `path`, SVG or PNG by its extension.
///
/// # Errors
/// [`PlotError`].
pub fn draw(spec: &PlotSpec<'_>, path: &Path) -> Result<(), PlotError> {
    let (w, h) = spec.size;
    if !(200..=8000).contains(&w) || !(200..=8000).contains(&h) {
        return Err(PlotError::BadSize(w, h));
    }
    if spec.sweep.points.is_empty() {
        return Err(PlotError::Empty);
    }
    font()?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => draw_on(&SVGBackend::new(path, spec.size).into_drawing_area(), spec),
        Some("png") => draw_on(
            &BitMapBackend::new(path, spec.size).into_drawing_area(),
            spec,
        ),
        _ => Err(PlotError::UnknownExtension(path.display().to_string())),
    }
}

/// `1234567` → `1,234,567`; fractions with one decimal below 10.
fn label_number(x: f64) -> String {
    if x >= 10.0 || x == x.round() {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "an axis label, rounded and non-negative"
        )]
        let n = x.round().max(0.0) as u64;
        crate::numfmt::thousands(n)
    } else {
        format!("{x:.1}")
    }
}

/// The 1-2-5 values from `lo` to `hi` (the labelled ticks of a log axis).
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powf(lo.max(1e-9).log10().floor());
    while decade <= hi && out.len() < 64 {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

/// `permille` thousandths of `h` pixels (`h` is at most 8000).
fn px(h: u32, permille: u32) -> i32 {
    i32::try_from(h.saturating_mul(permille) / 1000).unwrap_or(0)
}

fn gib(chunks: u32, bytes_per_chunk: u64) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "a size for people")]
    let bytes = bytes_per_chunk as f64;
    f64::from(chunks) * bytes / f64::from(1u32 << 30)
}

/// The lines: one per (policy, threshold), points by capacity.
/// The legend name of one policy and store threshold.
fn line_name(policy: &str, threshold: u32) -> String {
    if threshold >= 2 {
        format!("{}, store threshold {threshold}", policy.to_uppercase())
    } else {
        policy.to_uppercase()
    }
}

fn lines(sweep: &Sweep) -> Vec<(String, Vec<&SweepPoint>)> {
    let mut out: Vec<(String, Vec<&SweepPoint>)> = Vec::new();
    for p in &sweep.points {
        let name = line_name(p.case.policy.name(), p.case.threshold);
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(p),
            None => out.push((name, vec![p])),
        }
    }
    for (_, v) in &mut out {
        v.sort_by_key(|p| p.case.capacity);
    }
    out
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &PlotSpec<'_>,
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError::Draw(e.to_string());
    let (_, h) = spec.size;
    let text = |scale: f64| {
        let px = (f64::from(h) * scale).max(9.0);
        ("sans-serif", px).into_font()
    };
    root.fill(&WHITE).map_err(|e| err(&e))?;

    let caps = spec.sweep.points.iter().map(|p| p.case.capacity);
    let (lo, hi) = caps.fold((u32::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
    let (x_lo, x_hi) = (f64::from(lo.max(1)) / 1.3, f64::from(hi.max(1)) * 1.3);
    let best = spec
        .sweep
        .points
        .iter()
        .map(|p| p.counts.block_hit_rate())
        .fold(0.0, f64::max);
    let top = (best.max(spec.bound.unwrap_or(0.0)) * 100.0 * 1.12 + 2.0).min(100.0);

    let mut title = format!("CPU-tier block hit rate: {}", spec.trace);
    if let Some((model, _)) = &spec.model {
        title.push_str(&format!(", {model}"));
    }
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&title, text(0.036).style(FontStyle::Bold))
        .margin(px(h, 20))
        .margin_right(px(h, 45))
        .x_label_area_size(px(h, 110))
        .y_label_area_size(px(h, 110));
    if spec.model.is_some() {
        builder.top_x_label_area_size(px(h, 100));
    }
    let chart = builder
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale().with_key_points(ticks(x_lo, x_hi)),
            0.0..top,
        )
        .map_err(|e| err(&e))?;
    let bpc = spec.model.as_ref().map(|(_, b)| *b);
    // The GiB axis (drawn only with a model; without one the secondary coordinates are unused).
    // The secondary coordinates take the top label area, so the mesh is drawn after them.
    let scale = |x: f64| {
        #[expect(clippy::cast_precision_loss, reason = "a size for people")]
        let b = bpc.unwrap_or(1) as f64;
        x * b / f64::from(1u32 << 30)
    };
    let (g_lo, g_hi) = (scale(x_lo), scale(x_hi));
    let mut dual = chart.set_secondary_coord(
        (g_lo..g_hi).log_scale().with_key_points(ticks(g_lo, g_hi)),
        0.0..top,
    );
    let chunk_unit = format!("chunks of {} tokens", spec.block_tokens);
    dual.configure_mesh()
        .x_desc(format!("CPU tier capacity ({chunk_unit}, log scale)"))
        .y_desc("block hit rate (% of request blocks)")
        .x_labels(12)
        .y_labels(12)
        .x_label_formatter(&|x| label_number(*x))
        .y_label_formatter(&|y| format!("{y:.0}%"))
        .label_style(text(0.024))
        .axis_desc_style(text(0.027))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(|e| err(&e))?;
    if let Some((model, _)) = &spec.model {
        dual.configure_secondary_axes()
            .x_desc(format!("CPU memory for {model} (GiB, log scale)"))
            .x_labels(12)
            .x_label_formatter(&|x| label_number(*x))
            .y_labels(0)
            .label_style(text(0.024))
            .axis_desc_style(text(0.027))
            .draw()
            .map_err(|e| err(&e))?;
    }
    let chart = &mut *dual;

    if let Some(bound) = spec.bound {
        let y = bound * 100.0;
        chart
            .draw_series(DashedLineSeries::new(
                [(x_lo, y), (x_hi, y)],
                12,
                8,
                ShapeStyle::from(&RGBColor(90, 90, 90)).stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!(
                "infinite cache (every repeated block hits): {y:.1}%"
            ))
            .legend(|(x, y)| {
                let style = RGBColor(90, 90, 90).stroke_width(2);
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (9, 0)], style)
                    + PathElement::new(vec![(15, 0), (24, 0)], style)
            });
    }

    let stroke = (h / 300).max(2);
    let dot = (h / 170).max(3);
    for (i, (name, points)) in lines(spec.sweep).into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let xy: Vec<(f64, f64)> = points
            .iter()
            .map(|p| {
                (
                    f64::from(p.case.capacity),
                    p.counts.block_hit_rate() * 100.0,
                )
            })
            .collect();
        let style = color.stroke_width(stroke);
        let legend = move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 24, y)], style);
        match spec.sampled {
            Some(r) => chart
                .draw_series(DashedLineSeries::new(xy.clone(), 12, 6, style))
                .map_err(|e| err(&e))?
                .label(format!("{name} (sampled, R = {r})"))
                // The swatch dashed like the curve: two dashes with a gap.
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (9, 0)], style)
                        + PathElement::new(vec![(15, 0), (24, 0)], style)
                }),
            None => chart
                .draw_series(LineSeries::new(xy.clone(), style))
                .map_err(|e| err(&e))?
                .label(name)
                .legend(legend),
        };
        chart
            .draw_series(xy.into_iter().map(|c| Circle::new(c, dot, color.filled())))
            .map_err(|e| err(&e))?;
    }

    if !spec.checkpoints.is_empty() {
        let worst = spec
            .checkpoints
            .iter()
            .map(|c| c.error_points.abs())
            .fold(0.0, f64::max);
        let size = dot * 2;
        // Beside each sampled curve, its exact replays as a solid line of the same colour.
        for (i, (name, _)) in lines(spec.sweep).into_iter().enumerate() {
            let mut xy: Vec<(f64, f64)> = spec
                .checkpoints
                .iter()
                .filter(|c| line_name(c.policy, c.store_threshold) == name)
                .map(|c| (f64::from(c.capacity), c.exact_block_hit_rate * 100.0))
                .collect();
            if xy.len() < 2 {
                continue;
            }
            xy.sort_by(|a, b| a.0.total_cmp(&b.0));
            let style = COLORS[i % COLORS.len()].stroke_width(stroke);
            chart
                .draw_series(LineSeries::new(xy, style))
                .map_err(|e| err(&e))?
                .label(format!("{name} (exact replays)"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        }
        chart
            .draw_series(spec.checkpoints.iter().map(|c| {
                Cross::new(
                    (f64::from(c.capacity), c.exact_block_hit_rate * 100.0),
                    size,
                    BLACK.stroke_width(stroke),
                )
            }))
            .map_err(|e| err(&e))?
            .label(format!(
                "exact replays at checkpoints (largest error {worst:.2} pt)"
            ))
            .legend(move |(x, y)| Cross::new((x + 12, y), 6, BLACK.stroke_width(2)));
    }

    if let Some(knee) = spec.sweep.knee(KNEE_MARGIN) {
        let c = (
            f64::from(knee.case.capacity),
            knee.counts.block_hit_rate() * 100.0,
        );
        let size = dot * 3;
        let mut label = format!(
            "smallest within 1 pt of best: {} chunks",
            label_number(f64::from(knee.case.capacity))
        );
        if let Some(bpc) = bpc {
            label.push_str(&format!(
                " = {} GiB",
                label_number(gib(knee.case.capacity, bpc))
            ));
        }
        label.push_str(&format!(
            " ({}, {:.1}%)",
            knee.case.policy.name().to_uppercase(),
            c.1
        ));
        chart
            .draw_series(std::iter::once(Circle::new(
                c,
                size,
                BLACK.stroke_width(stroke),
            )))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 12, y), 6, BLACK.stroke_width(2)));
    }

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(text(0.024))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(160, 160, 160))
        .margin(10)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
