enable f16;@group(0)
@binding(0)
var<storage, read_write> buffer_0_global: array<vec4<f16>>;

@group(0)
@binding(1)
var<storage, read_write> buffer_1_global: array<u32>;

@group(0)
@binding(2)
var<storage, read_write> buffer_2_global: array<f32>;

@group(0)
@binding(3)
var<storage, read_write> buffer_3_global: array<vec4<f32>>;

@group(0)
@binding(4)
var<storage, read_write> buffer_4_global: array<f32>;

struct info_st {
   scalars_f32: array<f32, 2>,
   scalars_u32: array<u32, 8>,
   static_meta: array<u32, 10>,
}

@group(0)
@binding(5)
var<storage, read> info: info_st;

var<workgroup> shared_memory_10: array<f32, 512>;

var<workgroup> shared_memory_11: array<f32, 1>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn quantize_rows_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_103: u32;
var l_mut_16: f32;
var l_mut_172: u32;
var l_mut_27: vec4<f32>;
var l_mut_94: u32;
var l_mut_99: u32;
let l_0 = local_idx % u32(8);
let l_1 = local_idx / u32(8);
let l_2 = workgroup_id.x * u32(64);
let l_3 = workgroup_id.z * info.scalars_u32[3];
let l_4 = workgroup_id.y * info.scalars_u32[4];
let l_5 = l_3 + l_4;
let l_6 = workgroup_id.z * info.scalars_u32[7];
let l_7 = workgroup_id.y / info.scalars_u32[6];
let l_8 = l_6 + l_7;
let l_9 = l_8 * u32(16);

for (var l_mut_12: u32 = u32(0); l_mut_12 < u32(4); l_mut_12++) {
let l_13 = l_mut_12 * u32(16);
let l_14 = l_13 + l_1;
let l_15 = l_2 + l_14;
l_mut_16 = f32(0.0);
let l_17 = l_14 < u32(64);
let l_18 = l_15 < info.scalars_u32[0];
let l_19 = l_17 && l_18;
if l_19 {
let l_20 = l_15 * info.scalars_u32[5];
let l_21 = l_5 + l_20;

for (var l_mut_22: u32 = l_0; l_mut_22 < u32(16); l_mut_22 += u32(8)) {
let l_23 = l_21 / u32(4);
let l_24 = l_23 + l_mut_22;
let l_25 = buffer_0_global[l_24];
let l_26 = vec4<f32>(l_25);
l_mut_27 = l_26;
let l_28 = l_mut_27[u32(0)];
let l_29 = abs(l_28);
let l_30 = max(l_mut_16, l_29);
l_mut_16 = l_30;
let l_31 = l_mut_27[u32(1)];
let l_32 = abs(l_31);
let l_33 = max(l_mut_16, l_32);
l_mut_16 = l_33;
let l_34 = l_mut_27[u32(2)];
let l_35 = abs(l_34);
let l_36 = max(l_mut_16, l_35);
l_mut_16 = l_36;
let l_37 = l_mut_27[u32(3)];
let l_38 = abs(l_37);
let l_39 = max(l_mut_16, l_38);
l_mut_16 = l_39;
}
}
let l_40 = l_14 * u32(8);
let l_41 = l_40 + l_0;
shared_memory_10[l_41] = l_mut_16;
}
workgroupBarrier();

for (var l_mut_42: u32 = local_idx; l_mut_42 < u32(1); l_mut_42 += u32(128)) {
l_mut_16 = f32(0.0);
let l_43 = l_mut_42 * u32(64);
let l_44 = l_mut_42 * u32(64);
let l_45 = l_44 + u32(64);

for (var l_mut_46: u32 = l_43; l_mut_46 < l_45; l_mut_46++) {
let l_47 = l_mut_46 * u32(8);
let l_48 = l_47 + u32(0);
let l_49 = shared_memory_10[l_48];
let l_50 = max(l_mut_16, l_49);
l_mut_16 = l_50;
let l_51 = l_mut_46 * u32(8);
let l_52 = l_51 + u32(1);
let l_53 = shared_memory_10[l_52];
let l_54 = max(l_mut_16, l_53);
l_mut_16 = l_54;
let l_55 = l_mut_46 * u32(8);
let l_56 = l_55 + u32(2);
let l_57 = shared_memory_10[l_56];
let l_58 = max(l_mut_16, l_57);
l_mut_16 = l_58;
let l_59 = l_mut_46 * u32(8);
let l_60 = l_59 + u32(3);
let l_61 = shared_memory_10[l_60];
let l_62 = max(l_mut_16, l_61);
l_mut_16 = l_62;
let l_63 = l_mut_46 * u32(8);
let l_64 = l_63 + u32(4);
let l_65 = shared_memory_10[l_64];
let l_66 = max(l_mut_16, l_65);
l_mut_16 = l_66;
let l_67 = l_mut_46 * u32(8);
let l_68 = l_67 + u32(5);
let l_69 = shared_memory_10[l_68];
let l_70 = max(l_mut_16, l_69);
l_mut_16 = l_70;
let l_71 = l_mut_46 * u32(8);
let l_72 = l_71 + u32(6);
let l_73 = shared_memory_10[l_72];
let l_74 = max(l_mut_16, l_73);
l_mut_16 = l_74;
let l_75 = l_mut_46 * u32(8);
let l_76 = l_75 + u32(7);
let l_77 = shared_memory_10[l_76];
let l_78 = max(l_mut_16, l_77);
l_mut_16 = l_78;
}
let l_79 = l_mut_16 > f32(0.0);
let l_80 = bitcast<u32>(l_mut_16);
let l_81 = bitcast<u32>(f32(127.0));
let l_82 = l_80 & u32(2147483648);
let l_83 = l_80 >> u32(23);
let l_84 = l_83 & u32(255);
let l_85 = l_81 >> u32(23);
let l_86 = l_85 & u32(255);
let l_87 = l_80 & u32(8388607);
let l_88 = l_87 | u32(8388608);
let l_89 = l_81 & u32(8388607);
let l_90 = l_89 | u32(8388608);
let l_91 = l_88 < l_90;
let l_92 = select(u32(0), u32(1), l_91);
let l_93 = l_88 << l_92;
l_mut_94 = l_93;
let l_95 = l_84 + u32(127);
let l_96 = l_95 + u32(256);
let l_97 = l_96 - l_86;
let l_98 = l_97 - l_92;
l_mut_99 = u32(0);

for (var l_mut_100: u32 = u32(0); l_mut_100 < u32(25); l_mut_100++) {
l_mut_99 = l_mut_99 << u32(1);
let l_101 = l_mut_94 >= l_90;
if l_101 {
l_mut_94 = l_mut_94 - l_90;
l_mut_99 = l_mut_99 | u32(1);
}
l_mut_94 = l_mut_94 << u32(1);
}
let l_102 = l_mut_99 >> u32(1);
l_mut_103 = l_102;
let l_104 = l_mut_99 & u32(1);
let l_105 = l_104 == u32(1);
let l_106 = l_mut_94 != u32(0);
let l_107 = l_mut_103 & u32(1);
let l_108 = l_107 == u32(1);
let l_109 = l_106 || l_108;
let l_110 = l_105 && l_109;
let l_111 = select(u32(0), u32(1), l_110);
l_mut_103 = l_mut_103 + l_111;
let l_112 = l_mut_103 >> u32(24);
l_mut_103 = l_mut_103 >> l_112;
let l_113 = l_98 + l_112;
let l_114 = l_84 != u32(0);
let l_115 = l_113 >= u32(257);
let l_116 = l_114 && l_115;
let l_117 = l_113 <= u32(510);
let l_118 = l_116 && l_117;
let l_119 = l_113 - u32(256);
let l_120 = l_119 << u32(23);
let l_121 = l_82 | l_120;
let l_122 = l_mut_103 & u32(8388607);
let l_123 = l_121 | l_122;
let l_124 = select(l_82, l_123, l_118);
let l_125 = bitcast<f32>(l_124);
let l_126 = select(f32(1.0), l_125, l_79);
shared_memory_11[l_mut_42] = l_126;
let l_127 = workgroup_id.z * info.scalars_u32[1];
let l_128 = l_127 + workgroup_id.y;
let l_129 = l_128 * info.scalars_u32[2];
let l_130 = l_129 + workgroup_id.x;
let l_131 = l_130 * u32(1);
let l_132 = l_131 + l_mut_42;
let l_133 = l_126 * info.scalars_f32[0];
buffer_2_global[l_132] = l_133;
}
workgroupBarrier();

for (var l_mut_134: u32 = u32(0); l_mut_134 < u32(4); l_mut_134++) {
let l_135 = l_mut_134 * u32(16);
let l_136 = l_135 + l_1;
let l_137 = l_2 + l_136;
let l_138 = l_136 < u32(64);
let l_139 = l_137 < info.scalars_u32[0];
let l_140 = l_138 && l_139;
if l_140 {
l_mut_103 = u32(0);
let l_141 = shared_memory_11[l_mut_103];
let l_142 = l_137 * info.scalars_u32[5];
let l_143 = l_5 + l_142;

for (var l_mut_144: u32 = l_0; l_mut_144 < u32(16); l_mut_144 += u32(8)) {
let l_145 = l_143 / u32(4);
let l_146 = l_145 + l_mut_144;
let l_147 = buffer_0_global[l_146];
let l_148 = vec4<f32>(l_147);
l_mut_27 = l_148;
l_mut_103 = u32(0);

for (var l_mut_149: u32 = u32(0); l_mut_149 < u32(4); l_mut_149++) {
let l_150 = l_mut_27[l_mut_149];
let l_151 = bitcast<u32>(l_150);
let l_152 = bitcast<u32>(l_141);
let l_153 = l_151 & u32(2147483648);
let l_154 = l_151 >> u32(23);
let l_155 = l_154 & u32(255);
let l_156 = l_152 >> u32(23);
let l_157 = l_156 & u32(255);
let l_158 = l_151 & u32(8388607);
let l_159 = l_158 | u32(8388608);
let l_160 = l_152 & u32(8388607);
let l_161 = l_160 | u32(8388608);
let l_162 = l_159 < l_161;
let l_163 = select(u32(0), u32(1), l_162);
let l_164 = l_159 << l_163;
l_mut_99 = l_164;
let l_165 = l_155 + u32(127);
let l_166 = l_165 + u32(256);
let l_167 = l_166 - l_157;
let l_168 = l_167 - l_163;
l_mut_94 = u32(0);

for (var l_mut_169: u32 = u32(0); l_mut_169 < u32(25); l_mut_169++) {
l_mut_94 = l_mut_94 << u32(1);
let l_170 = l_mut_99 >= l_161;
if l_170 {
l_mut_99 = l_mut_99 - l_161;
l_mut_94 = l_mut_94 | u32(1);
}
l_mut_99 = l_mut_99 << u32(1);
}
let l_171 = l_mut_94 >> u32(1);
l_mut_172 = l_171;
let l_173 = l_mut_94 & u32(1);
let l_174 = l_173 == u32(1);
let l_175 = l_mut_99 != u32(0);
let l_176 = l_mut_172 & u32(1);
let l_177 = l_176 == u32(1);
let l_178 = l_175 || l_177;
let l_179 = l_174 && l_178;
let l_180 = select(u32(0), u32(1), l_179);
l_mut_172 = l_mut_172 + l_180;
let l_181 = l_mut_172 >> u32(24);
l_mut_172 = l_mut_172 >> l_181;
let l_182 = l_168 + l_181;
let l_183 = l_155 != u32(0);
let l_184 = l_182 >= u32(257);
let l_185 = l_183 && l_184;
let l_186 = l_182 <= u32(510);
let l_187 = l_185 && l_186;
let l_188 = l_182 - u32(256);
let l_189 = l_188 << u32(23);
let l_190 = l_153 | l_189;
let l_191 = l_mut_172 & u32(8388607);
let l_192 = l_190 | l_191;
let l_193 = select(l_153, l_192, l_187);
let l_194 = bitcast<f32>(l_193);
let l_195 = round(l_194);
let l_196 = clamp(l_195, f32(-127.0), f32(127.0));
let l_197 = l_196 < f32(0.0);
let l_198 = l_196 + f32(256.0);
let l_199 = select(l_196, l_198, l_197);
let l_200 = u32(l_199);
let l_201 = u32(8) * l_mut_149;
let l_202 = l_200 << l_201;
l_mut_103 = l_mut_103 | l_202;
}
let l_203 = l_143 / u32(4);
let l_204 = l_203 + l_mut_144;
buffer_1_global[l_204] = l_mut_103;
}
let l_205 = l_0 == u32(0);
if l_205 {
l_mut_16 = f32(0.0);

for (var l_mut_206: u32 = u32(0); l_mut_206 < u32(16); l_mut_206++) {
let l_207 = l_143 / u32(4);
let l_208 = l_207 + l_mut_206;
let l_209 = buffer_0_global[l_208];
let l_210 = vec4<f32>(l_209);
let l_211 = l_9 + l_mut_206;
let l_212 = buffer_3_global[l_211];
let l_213 = l_210[u32(0)];
let l_214 = l_212[u32(0)];
let l_215 = l_213 * l_214;
l_mut_16 = l_mut_16 + l_215;
let l_216 = l_210[u32(1)];
let l_217 = l_212[u32(1)];
let l_218 = l_216 * l_217;
l_mut_16 = l_mut_16 + l_218;
let l_219 = l_210[u32(2)];
let l_220 = l_212[u32(2)];
let l_221 = l_219 * l_220;
l_mut_16 = l_mut_16 + l_221;
let l_222 = l_210[u32(3)];
let l_223 = l_212[u32(3)];
let l_224 = l_222 * l_223;
l_mut_16 = l_mut_16 + l_224;
}
let l_225 = workgroup_id.z * info.scalars_u32[1];
let l_226 = l_225 + workgroup_id.y;
let l_227 = l_226 * info.scalars_u32[0];
let l_228 = l_227 + l_137;
let l_229 = l_mut_16 * info.scalars_f32[1];
buffer_4_global[l_228] = l_229;
}
}
}
}
